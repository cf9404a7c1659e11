"""Checkpoint conversions behind tools/model_converters/: publish_model (a training checkpoint's weights and meta,
named by their SHA-256) and mmpretrain_vit2vitdet (an mmpretrain ViT classifier into our ViTDet backbones'). Not
imported by ``condtok_mm``."""
