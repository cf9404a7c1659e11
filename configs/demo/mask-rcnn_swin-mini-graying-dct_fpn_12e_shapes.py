# Token Graying's DCT form (Token Graying, arXiv 2505.01996): the SVD-form twin with the token grid's 2-D DCT-II
# frequencies standing in for the singular vectors (mode 'graying_dct', condtok_mm/conditioning/dct_graying.py);
# nothing else differs.
_base_ = './mask-rcnn_swin-mini-graying_fpn_12e_shapes.py'

model = dict(backbone=dict(conditioning=dict(mode='graying_dct')))
