# The norm-matched control of the conditioned NEON config: (X + C) / r, kappa <= 2 at the scale of X, so that a
# difference from the conditioned twin is the token scale the conditioning brings, not its kappa.
_base_ = './faster-rcnn_swin-mini-condtok_fpn_400e_neon-trees.py'

model = dict(backbone=dict(conditioning=dict(control='norm_matched')))
