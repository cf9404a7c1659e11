"""WeightsOnlyInit: a module whose ``init_weights`` never runs a checkpoint's pickle, with or without the opt-in."""
from condtok_mm.compat.checkpoint_loading import weights_only_loading

__all__ = ['WeightsOnlyInit']


class WeightsOnlyInit:
    """Mixin, listed before the mmengine module it extends: ``init_weights`` runs inside
    :func:`~condtok_mm.compat.checkpoint_loading.weights_only_loading`.

    A ``Pretrained`` ``init_cfg`` of the module, or of any module inside it (the backbone a wrapper holds), then
    loads with torch's weights-only unpickler and condtok_mm's allow-list whether or not the host applied
    :mod:`condtok_mm.compat`. Without it mmengine 0.10.7 reads an http(s):// checkpoint through torch.hub with
    ``weights_only=False`` (mmengine/runner/checkpoint.py ``load_from_http``), which runs whatever the file's
    pickle says. mmengine's loaders are restored when ``init_weights`` returns.
    """

    def init_weights(self) -> None:
        with weights_only_loading():
            super().init_weights()
