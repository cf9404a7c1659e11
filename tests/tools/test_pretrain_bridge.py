"""Protocol P2's bridge from mmpretrain to mmdet: the checkpoint of an mmpretrain classifier (conditioned or not)
loads as the backbone of our detection configs through their own init_cfg and mmengine's checkpoint loading,
every weight of it (no backbone key missing, none left over, values equal)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import condtok_mm  # noqa: F401
import condtok_mm.compat
from condtok_mm.model_converters import mmpretrain_vit2vitdet as converter
from helpers.pretrained import DEMO, build, pretrained_classifier, saved_classifier
from helpers.repo import REPO_ROOT
# (classification config, detection config it is the pretraining of)
PAIRS = [('swin-mini_1xb32-20e_shapes-cls.py', 'mask-rcnn_swin-mini-pretrained_fpn_12e_shapes.py'),  # P0
         ('swin-mini_1xb32-20e_shapes-cls.py', 'mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py'),  # P1
         ('swin-mini-condtok_1xb32-20e_shapes-cls.py', 'mask-rcnn_swin-mini-condtok-condpretrained_fpn_12e_shapes.py')]


def detector_initialised_from(detection_config, checkpoint):
    cfg = Config.fromfile(osp.join(DEMO, detection_config))
    cfg.model.backbone.init_cfg.checkpoint = checkpoint
    torch.manual_seed(1)
    detector = build(cfg.model, 'mmdet')
    detector.init_weights()  # what the Runner does before training
    return detector


@pytest.mark.parametrize('classification_config, detection_config', PAIRS, ids=lambda name: name.split('_')[1])
@pytest.mark.slow
def test_every_backbone_weight_of_the_classifier_lands_in_the_detector(tmp_path, classification_config,
                                                                      detection_config):
    condtok_mm.compat.apply()  # mmengine's checkpoint loading, weights-only on torch >= 2.6
    checkpoint = str(tmp_path / 'epoch_20.pth')
    state = pretrained_classifier(classification_config, checkpoint)
    pretrained = {key[len('backbone.'):]: value for key, value in state.items() if key.startswith('backbone.')}
    assert set(state) - {f'backbone.{key}' for key in pretrained} == {'head.fc.weight', 'head.fc.bias'}
    backbone = detector_initialised_from(detection_config, checkpoint).backbone.state_dict()
    assert sorted(set(backbone) - set(pretrained)) == []  # missing: a detector weight the checkpoint has not
    assert sorted(set(pretrained) - set(backbone)) == []  # unexpected: a pretrained weight the detector drops
    for key, value in pretrained.items():
        torch.testing.assert_close(backbone[key], value, rtol=0, atol=0, msg=key)


def test_the_conditioned_classifier_and_detector_condition_the_same_tokens():
    """P2's premise: the detector conditions what its backbone was pretrained on, the patch-embedding output."""
    classification = Config.fromfile(osp.join(DEMO, 'swin-mini-condtok_1xb32-20e_shapes-cls.py')).model.backbone
    detection = Config.fromfile(osp.join(DEMO, PAIRS[2][1])).model.backbone
    assert classification.conditioning == detection.conditioning
    assert (classification.targets, detection.condition_stages) == (('patch_embed', ), (0, ))
    cls_backbone = build(classification, 'mmpretrain')
    detection.init_cfg = None
    det_backbone = build(detection, 'mmdet')
    det_backbone.load_state_dict(cls_backbone.state_dict())
    cls_backbone.eval(), det_backbone.eval()
    image = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for ours, theirs in zip(cls_backbone(image), det_backbone(image)):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_mmpretrain_swin_t_checkpoint_has_the_coco_detectors_backbone_keys():
    """Protocol P2 on COCO (configs/suites/coco_protocols_swin-t_1x.py): every weight of the conditioned ImageNet
    Swin-T's backbone has its place in the conditioned Swin-T Mask R-CNN's, with its shape; the detector's only
    other weights are the output norms of stages 0-2, which mmpretrain's Swin-T (out_indices=(3,)) does not have."""
    classification = Config.fromfile(osp.join(REPO_ROOT, 'configs/classification/swin-tiny-condtok_16xb64_in1k.py'))
    detection = Config.fromfile(osp.join(REPO_ROOT, 'configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'))
    detection.model.backbone.init_cfg = None
    pretrained = build(classification.model.backbone, 'mmpretrain').state_dict()
    backbone = build(detection.model.backbone, 'mmdet').state_dict()
    assert sorted(set(pretrained) - set(backbone)) == []
    assert sorted(set(backbone) - set(pretrained)) == [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')]
    assert {key: value.shape for key, value in pretrained.items()} == {key: backbone[key].shape for key in pretrained}


def test_a_conditioned_mmpretrain_xcit_checkpoint_lands_in_the_xcit_detectors_backbone(tmp_path):
    """XCiT: the detector wraps mmpretrain's own XCiT (configs/xcit/), whose init_cfg strips the classifier's
    'backbone.' prefix; shrunk (embedding 48, depth 4) from the configs' structure to build in a second."""
    condtok_mm.compat.apply()
    small = dict(embed_dims=48, depth=4, num_heads=4)
    classification = Config.fromfile(osp.join(REPO_ROOT, 'configs/classification/xcit-medium-24-p16-condtok_8xb128_in1k.py'))
    classification.model.backbone.backbone.update(small)
    classification.model.head.in_channels = small['embed_dims']
    checkpoint = str(tmp_path / 'xcit.pth')
    state = saved_classifier(classification, checkpoint, epoch=300)
    detection = Config.fromfile(osp.join(REPO_ROOT, 'configs/xcit/mask-rcnn_xcit-s12-p16-condtok_rescale-fpn_ms-crop-3x_coco.py'))
    detection.model.backbone.backbone.update(small, out_indices=(1, 3))
    detection.model.backbone.backbone.init_cfg.checkpoint = checkpoint
    backbone = build(detection.model.backbone, 'mmdet')
    backbone.init_weights()
    loaded = backbone.state_dict()
    pretrained = {key[len('backbone.'):]: value for key, value in state.items() if key.startswith('backbone.')}
    assert sorted(set(loaded) - set(pretrained)) == [] and sorted(set(pretrained) - set(loaded)) == []
    for key, value in pretrained.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)


def test_a_conditioned_mmpretrain_vit_checkpoint_converts_into_the_vitdet_detectors_backbone(tmp_path):
    """ViT: mmpretrain's VisionTransformer and ViTDetViT (MAE's names) differ in every key: the converter maps each
    of them, and the detector's own init_cfg then loads every converted weight; only ViTDet's relative position
    embeddings (not in any ImageNet ViT) keep their initialisation. Shrunk (embedding 48, depth 2) from the configs."""
    condtok_mm.compat.apply()
    classification = Config.fromfile(osp.join(REPO_ROOT, 'configs/classification/vit-base-p16-condtok_64xb64_in1k.py'))
    classification.model.backbone.backbone.arch = dict(embed_dims=48, num_layers=2, num_heads=4, feedforward_channels=192)
    classification.model.head.update(in_channels=48, hidden_dim=96)
    source, converted = str(tmp_path / 'vit.pth'), str(tmp_path / 'vitdet.pth')
    state = saved_classifier(classification, source, epoch=300)
    converter.main([source, converted])
    detection = Config.fromfile(osp.join(REPO_ROOT, 'configs/vitdet/mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py'))
    detection.model.backbone.update(img_size=128, embed_dim=48, depth=2, num_heads=4, window_size=4,
                                    window_block_indexes=[0])
    detection.model.backbone.init_cfg.checkpoint = converted
    backbone = build(detection.model.backbone, 'mmdet')
    backbone.init_weights()
    loaded = backbone.state_dict()
    pretrained = {key[len('backbone.'):]: value for key, value in state.items() if key.startswith('backbone.')}
    names = {'pos_embed': 'pos_embed', 'patch_embed.projection.weight': 'patch_embed.proj.weight',
             'patch_embed.projection.bias': 'patch_embed.proj.bias'}
    for i in range(2):
        for p in ('weight', 'bias'):
            names.update({f'layers.{i}.ln1.{p}': f'blocks.{i}.norm1.{p}', f'layers.{i}.ln2.{p}': f'blocks.{i}.norm2.{p}',
                          f'layers.{i}.attn.qkv.{p}': f'blocks.{i}.attn.qkv.{p}',
                          f'layers.{i}.attn.proj.{p}': f'blocks.{i}.attn.proj.{p}',
                          f'layers.{i}.ffn.layers.0.0.{p}': f'blocks.{i}.mlp.fc1.{p}',
                          f'layers.{i}.ffn.layers.1.{p}': f'blocks.{i}.mlp.fc2.{p}'})
    # the classification-only weights: the class token and the final norm
    assert sorted(set(pretrained) - set(names)) == ['cls_token', 'ln1.bias', 'ln1.weight']
    assert sorted(set(loaded) - set(names.values())) == [f'blocks.{i}.attn.rel_pos_{a}' for i in range(2) for a in 'hw']
    for theirs, ours in names.items():
        torch.testing.assert_close(loaded[ours], pretrained[theirs], rtol=0, atol=0, msg=ours)
    with pytest.raises(ValueError, match=r"keys that have no place in ViTDetViT: \['backbone.layers.0.gamma1'\]"):
        converter.convert_vit({**state, 'backbone.layers.0.gamma1': torch.ones(48)})
