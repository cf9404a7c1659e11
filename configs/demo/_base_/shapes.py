# The embedded synthetic shapes dataset as the demos load it (`python tools/dataset/make_shapes.py` writes it to
# data/shapes/): COCO-format instances of four kinds of shape for the detection demos, and label maps of the same
# images (semantic/, 0 the background) for the segmentation demo; 4 images per batch on one process, the batch
# the demos' learning rates are set for.
#
# A demo inherits this file beside its COCO or ADE20K config, and mmengine refuses a key that two bases both
# define (data_root, train_dataloader, ...): so everything here sits under `shapes`. The demo takes what it
# needs (`train_dataloader = _base_.shapes.train_dataloader`, then its own pipeline) and removes the rest
# (`del _base_.shapes`, as mmdet's qdtrack configs remove `_base_.model`), so that the resolved demo config is
# what writing the dataset out in it would give.
__data_root = 'data/shapes/'
__classes = ('circle', 'square', 'triangle', 'star')
__palette = [(220, 20, 60), (0, 128, 255), (0, 200, 0), (255, 200, 0)]
__metainfo = dict(classes=__classes, palette=__palette)
__semantic_metainfo = dict(classes=('background', ) + __classes, palette=[(0, 0, 0)] + __palette)

shapes = dict(
    data_root=__data_root,
    # detection and instance segmentation: mmdet's CocoDataset (the COCO config's dataset type)
    metainfo=__metainfo,
    train_dataloader=dict(
        batch_size=4,
        num_workers=1,
        dataset=dict(data_root=__data_root, metainfo=__metainfo, ann_file='annotations/instances_train.json',
                     data_prefix=dict(img='train/'))),
    val_dataloader=dict(
        batch_size=4,
        num_workers=1,
        dataset=dict(data_root=__data_root, metainfo=__metainfo, ann_file='annotations/instances_val.json',
                     data_prefix=dict(img='val/'))),
    val_evaluator=dict(ann_file=__data_root + 'annotations/instances_val.json'),
    # semantic segmentation: mmseg's BaseSegDataset on the label maps
    semantic_metainfo=__semantic_metainfo,
    semantic_dataset=dict(type='BaseSegDataset', data_root=__data_root, metainfo=__semantic_metainfo,
                          img_suffix='.png', seg_map_suffix='.png', reduce_zero_label=False),
    semantic_train_prefix=dict(img_path='train/', seg_map_path='semantic/train/'),
    semantic_val_prefix=dict(img_path='val/', seg_map_path='semantic/val/'))
