# CPU-sized conditioned demo with the conditioner's other mode: the conditioned demo with mode='floor' (lift
# only the singular values below s_1 / target_kappa up to it, leaving the rest of the tokens untouched)
# instead of the paper's 'sigma_max' (shift all singular values by s_1). Same bound kappa <= 2, far smaller
# change of the token scale; a variant for suites of tools/suites/run_suite.py.
_base_ = './mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'

model = dict(backbone=dict(conditioning=dict(mode='floor')))
