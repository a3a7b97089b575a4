"""Ray 2.60's AWS provider modules for the tests of cluster.yaml and docs/aws/, importable without
boto3 (tests/test_cluster_config.py, tests/test_aws_policies.py)."""


def provider_modules():
    """Ray 2.60's AWS provider modules (`ray.autoscaler._private.aws`): (config, node_provider). They
    import boto3 and botocore at the top, though the functions used here make no AWS call. boto3 is not
    in the dev extra (botocore caps python-dateutil below 3; the lock pins 4), so where it is missing,
    empty modules stand in for the imports alone, and are taken out again afterwards."""
    import importlib
    import sys
    import types

    before = set(sys.modules)
    try:
        import boto3  # noqa: F401
    except ImportError:
        names = {
            "boto3": {"__version__": "1.44.8"},
            "boto3.exceptions": {"ResourceNotExistsError": type("ResourceNotExistsError", (Exception,), {})},
            "boto3.resources": {},
            "boto3.resources.base": {"ServiceResource": object},
            "botocore": {},
            "botocore.client": {"BaseClient": object},
            "botocore.config": {"Config": object},
            "botocore.exceptions": {"ClientError": type("ClientError", (Exception,), {})},
        }
        for name, attributes in names.items():
            sys.modules[name] = types.ModuleType(name)
            vars(sys.modules[name]).update(attributes)
        sys.modules["botocore"].exceptions = sys.modules["botocore.exceptions"]
    modules = (
        importlib.import_module("ray.autoscaler._private.aws.config"),
        importlib.import_module("ray.autoscaler._private.aws.node_provider"),
    )
    yield modules
    for name in set(sys.modules) - before:
        if name.split(".")[0] in {"boto3", "botocore"} or name.startswith("ray.autoscaler._private.aws"):
            del sys.modules[name]
