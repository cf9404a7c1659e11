"""Draw where the token conditioner sits in the two conditioned detectors (the figure of docs/en/index.md).

    python tools/analysis/draw_architecture.py [--out docs/en/_static/architecture.png]

One row per backbone, in the order their forward passes run: CondSwinTransformer conditions the
patch-embedding output before its (optional) absolute position embedding and dropout (condition_stages=(0, ));
CondViT conditions it before the absolute position embedding is added (condition_after_pos_embed=False).
The same inputs give the same bytes: matplotlib's PNG metadata, which names its version, is left out.
"""
import argparse
import os
import os.path as osp

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from condtok_mm.utils.package_files import package_root  # noqa: E402

DEFAULT_OUT = osp.join(package_root(), 'docs', 'en', '_static', 'architecture.png')
CONDITIONER = 'conditioner\nX + C, κ ≤ 2'
ROWS = [
    ('Swin detector: CondSwinTransformer backbone',
     ['image', 'patch\nembedding', CONDITIONER, 'Swin\nstages 1–4', 'FPN', 'RPN +\nRoI heads']),
    ('ViTDet detector: CondViT backbone',
     ['image', 'patch\nembedding', CONDITIONER, '+ abs. pos.\nembedding', 'ViT blocks', 'simple\nFPN',
      'RPN +\nRoI heads']),
]
CAPTION = ('The conditioner has no parameters: C is recomputed from each image\'s own tokens X on every forward '
           'pass.')
WIDTH_IN, HEIGHT_IN, DPI = 9.0, 3.4, 100  # 900 px wide, the width the docs show it at
BOX_W, BOX_H, STEP = 0.112, 0.2, 0.138  # in axes fractions: seven boxes and their arrows span the width
PLAIN = dict(face='#eef2f7', edge='#5b6b7f', weight='normal')
HIGHLIGHT = dict(face='#ffd966', edge='#b45f06', weight='bold')


def draw_row(ax, title, boxes, y):
    """The row's title above it and its boxes left to right at height ``y``, joined by arrows."""
    ax.text(0.01, y + BOX_H / 2 + 0.05, title, fontsize=10, fontweight='bold', va='bottom')
    for i, label in enumerate(boxes):
        style = HIGHLIGHT if label == CONDITIONER else PLAIN
        x = 0.01 + i * STEP
        ax.add_patch(FancyBboxPatch((x, y - BOX_H / 2), BOX_W, BOX_H, boxstyle='round,pad=0.004,rounding_size=0.015',
                                    facecolor=style['face'], edgecolor=style['edge'],
                                    linewidth=2.0 if style is HIGHLIGHT else 1.0))
        ax.text(x + BOX_W / 2, y, label, ha='center', va='center', fontsize=9, fontweight=style['weight'])
        if i:
            ax.annotate('', xy=(x, y), xytext=(x - (STEP - BOX_W), y),
                        arrowprops=dict(arrowstyle='->', color='#333333', lw=1.2))


def draw(out):
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis('off')
    for (title, boxes), y in zip(ROWS, (0.7, 0.3)):
        draw_row(ax, title, boxes, y)
    ax.text(0.5, 0.04, CAPTION, ha='center', va='bottom', fontsize=9.5, style='italic')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=DPI, metadata={'Software': None})
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description='Draw where the token conditioner sits in the detectors')
    parser.add_argument('--out', default=DEFAULT_OUT, help='PNG to write (default: %(default)s)')
    args = parser.parse_args(argv)
    draw(args.out)
    print(args.out)


if __name__ == '__main__':
    main()
