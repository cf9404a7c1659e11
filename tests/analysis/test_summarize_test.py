"""tools/analysis/summarize_test.py: the COCO table of the newest tools/test.py run, with '–' where an area range
holds no object (COCO's -1)."""
import json

from condtok_mm.analysis import summarize_test


def test_an_area_without_objects_reads_as_a_dash_not_minus_100(tmp_path, capsys):
    run = tmp_path / '20260101_000000'
    run.mkdir()
    metrics = {f'coco/{task}_mAP{suffix}': value for task in ('bbox', 'segm')
               for suffix, value in (('', 0.189), ('_50', 0.4), ('_75', 0.15), ('_s', 0.1), ('_m', 0.3), ('_l', -1.0))}
    (run / '20260101_000000.json').write_text(json.dumps(metrics))
    summarize_test.main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert 'bbox     18.9   40.0   15.0   10.0   30.0      –' in lines
    assert not any('-100.0' in line for line in lines)
