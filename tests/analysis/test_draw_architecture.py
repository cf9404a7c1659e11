"""tools/analysis/draw_architecture.py: the figure of where the conditioner sits, drawn as the backbones run."""
import inspect

import matplotlib.image

from condtok_mm.models.backbones.cond_swin import CondSwinTransformer
from condtok_mm.models.backbones.cond_vit import CondViT
from condtok_mm.analysis import draw_architecture


def test_it_writes_the_same_900_px_wide_png_each_time(tmp_path, capsys):
    first, second = tmp_path / 'a' / 'architecture.png', tmp_path / 'b.png'
    draw_architecture.main(['--out', str(first)])
    draw_architecture.main(['--out', str(second)])
    assert capsys.readouterr().out.split() == [str(first), str(second)]
    assert first.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert matplotlib.image.imread(first).shape[:2] == (340, 900)
    assert first.read_bytes() == second.read_bytes()


def test_the_conditioner_is_drawn_where_the_backbones_put_it_by_default():
    # Swin conditions the patch-embedding output (stage 0); ViT conditions it before the position embedding
    assert inspect.signature(CondSwinTransformer).parameters['condition_stages'].default == (0, )
    assert inspect.signature(CondViT).parameters['condition_after_pos_embed'].default is False
    (swin_title, swin), (vit_title, vit) = draw_architecture.ROWS
    assert 'CondSwinTransformer' in swin_title and 'CondViT' in vit_title
    conditioner = draw_architecture.CONDITIONER
    assert swin[:3] == ['image', 'patch\nembedding', conditioner]
    assert vit[:4] == ['image', 'patch\nembedding', conditioner, '+ abs. pos.\nembedding']
