"""Register Mechanism: register an object with a name, and get it later.

Example::

    from easycore.common.registry import Registry

    MODEL_REGISTRY = Registry("MODEL")

    @MODEL_REGISTRY.register()
    class ResNet50:
        pass

    model_class = MODEL_REGISTRY.get("ResNet50")
"""

from easycore.common.registry.registry import AlreadyRegisteredError, Registry, RegistryKeyError

__all__ = ["AlreadyRegisteredError", "Registry", "RegistryKeyError"]
