# Token Graying's DCT form (Token Graying, arXiv 2505.01996): the SVD-form twin with the token grid's 2-D DCT-II
# frequencies standing in for the singular vectors (mode 'graying_dct', condtok_mm/conditioning/dct_graying.py);
# nothing else differs.
_base_ = './mask-rcnn_xcit-s12-p16-graying_rescale-fpn_ms-crop-3x_coco.py'

model = dict(backbone=dict(conditioning=dict(mode='graying_dct')))
