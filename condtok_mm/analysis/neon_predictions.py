"""Tree-crown detectors' predictions drawn on a NEON photograph beside its ground truth.

    python tools/analysis/neon_predictions.py CONFIG CHECKPOINT [CONFIG CHECKPOINT ...] --labels LABEL [LABEL ...] \
        --out-dir DIR [--split test] [--score-thr 0.3] [--data-root data/neon_trees/] [--metrics JSON [JSON ...]] \
        [--dpi 100]

Each model runs on CPU in eval mode through mmdet's ``init_detector`` and ``inference_detector`` (the config's own
test pipeline; the checkpoint read with torch's weights-only unpickler, so nothing in it runs) on every tile of
the split that ``tools/dataset/make_neon_trees.py`` wrote (DATA_ROOT/annotations/instances_SPLIT.json, whose
image entries give each tile's ``source`` photograph and its ``window`` [x0, y0, x1, y1] there).

Merge rule, the same for the ground truth and for every model: each tile's boxes are moved into the photograph by
its window, and **a box is kept only from the tile whose centre is nearest to the box's centre** (on a tie, the
earlier tile in the annotation file). On a grid of tiles, which make_neon_trees.py writes, each tile then owns the
rectangle between the midpoints to its neighbours: an overlap is split in its middle, where a crown lies whole in
both tiles (the test image's overlaps are 351 and 165 px wide, its largest crown 107 px), and a crown is cut only
where tiles abut without overlapping, as the tile evaluation cuts it (the part with at least half of the crown a
tree, the other an ignore region). Keeping the part that no earlier tile covers instead would cut crowns at the
far edge of an overlap, which the later tile saw whole.

Writes, for each photograph of the split, SOURCE.png (the photograph reassembled from its tiles; side by side the
ground truth, trees solid and ignore regions dashed grey, then each model's predictions with a score of at least
--score-thr, those matched to a tree told apart from the rest, each panel titled with its counts and, given
--metrics, the model's AP on the split) and SOURCE.json (the merged ground truth and each model's merged
predictions, every box the model returns, with its score, in the photograph's pixel coordinates), and prints a
table: label, predictions with a score of at least --score-thr, those matched to a tree at IoU >= 0.5 (one to
one, highest score first, as COCO matches), trees.
"""
import argparse
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from mmdet.structures.bbox import bbox_overlaps  # noqa: E402
from PIL import Image  # noqa: E402
from tqdm import tqdm  # noqa: E402

from condtok_mm.compat.checkpoint_loading import weights_only_loading  # noqa: E402

MATCH_IOU = 0.5
MERGE_RULE = ('each tile\'s boxes moved into the photograph by its window; a box kept only from the tile whose '
              'centre is nearest to its centre (overlaps split in their middle)')
COLOURS = dict(tree='yellow', ignore='silver', matched='deepskyblue', unmatched='orangered')


def read_split(ann_file: str) -> List[dict]:
    """The tiles of a split in the annotation file's order, each a dict of ``file_name``, ``source``, ``window``
    (x0, y0, x1, y1 in the photograph), ``boxes`` ((N, 4) float64, x0 y0 x1 y1 in the tile) and ``iscrowd`` ((N,)
    bool, the ignore regions).

    Args:
        ann_file (str): a COCO annotation file written by tools/dataset/make_neon_trees.py.
    """
    if not osp.isfile(ann_file):
        raise FileNotFoundError(f'{ann_file}: no such annotation file; make the dataset with `python '
                                'tools/dataset/make_neon_trees.py --out-dir DATA_ROOT`, or give --data-root and '
                                '--split of one made')
    with open(ann_file) as f:
        coco = json.load(f)
    tiles, by_id = [], {}
    for image in coco['images']:
        missing = [key for key in ('source', 'window') if key not in image]
        if missing:
            raise ValueError(f'{ann_file}: the image {image.get("file_name", image.get("id"))} has no '
                             f'{" or ".join(missing)}, so its tile cannot be placed in a photograph; give a split '
                             'written by tools/dataset/make_neon_trees.py, which records each tile\'s source and '
                             'window')
        tile = dict(file_name=image['file_name'], source=image['source'], window=tuple(image['window']), boxes=[],
                    iscrowd=[])
        tiles.append(tile)
        by_id[image['id']] = tile
    for annotation in coco['annotations']:
        x, y, w, h = annotation['bbox']
        by_id[annotation['image_id']]['boxes'].append([x, y, x + w, y + h])
        by_id[annotation['image_id']]['iscrowd'].append(bool(annotation.get('iscrowd', 0)))
    for tile in tiles:
        tile['boxes'] = np.asarray(tile['boxes'], dtype=np.float64).reshape(-1, 4)
        tile['iscrowd'] = np.asarray(tile['iscrowd'], dtype=bool)
    return tiles


def to_photograph(boxes: np.ndarray, window: Sequence[float]) -> np.ndarray:
    """``boxes`` (N, 4), x0 y0 x1 y1 in a tile, in the coordinates of the photograph the tile was cut from.

    Args:
        boxes (np.ndarray): (N, 4) boxes in the tile's pixel coordinates.
        window (sequence): the tile's place in the photograph, (x0, y0, x1, y1).
    """
    return np.asarray(boxes, dtype=np.float64) + np.tile(np.asarray(window[:2], dtype=np.float64), 2)


def merge_tiles(windows: Sequence[Sequence[float]], boxes: Sequence[np.ndarray],
                values: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """The boxes of overlapping tiles as one set in the photograph, by the module's merge rule: a box is kept only
    from the tile whose centre is nearest to the box's centre (on a tie, the earlier tile).

    Args:
        windows (sequence): each tile's (x0, y0, x1, y1) in the photograph.
        boxes (sequence): each tile's (N_t, 4) boxes in its own coordinates.
        values (sequence): each tile's (N_t,) values of its boxes (scores, ignore flags), kept with them.

    Returns:
        tuple: ((M, 4) boxes in the photograph, (M,) their values), tile by tile in order.
    """
    windows = np.asarray(windows, dtype=np.float64).reshape(-1, 4)
    centres = (windows[:, :2] + windows[:, 2:]) / 2
    kept_boxes, kept_values = [], []
    for index, (window, tile_boxes, tile_values) in enumerate(zip(windows, boxes, values)):
        placed = to_photograph(np.asarray(tile_boxes).reshape(-1, 4), window)
        box_centres = (placed[:, :2] + placed[:, 2:]) / 2
        distances = ((box_centres[:, None, :] - centres[None]) ** 2).sum(-1)
        own = distances.argmin(axis=1) == index  # argmin takes the first of equal distances: the earlier tile
        kept_boxes.append(placed[own])
        kept_values.append(np.asarray(tile_values)[own])
    return np.concatenate(kept_boxes).reshape(-1, 4), np.concatenate(kept_values)


def match(boxes: np.ndarray, scores: np.ndarray, trees: np.ndarray, iou_thr: float = MATCH_IOU) -> np.ndarray:
    """Which predictions match a tree one to one, as COCO matches: in order of decreasing score, each takes the
    untaken tree it overlaps most, if their IoU is at least ``iou_thr``.

    Args:
        boxes (np.ndarray): (N, 4) predicted boxes, x0 y0 x1 y1.
        scores (np.ndarray): (N,) their scores.
        trees (np.ndarray): (M, 4) ground-truth trees (not the ignore regions), x0 y0 x1 y1.
        iou_thr (float): the least IoU of a match. Default: 0.5.

    Returns:
        np.ndarray: (N,) bool, True for a matched prediction.
    """
    matched = np.zeros(len(boxes), dtype=bool)
    if len(boxes) == 0 or len(trees) == 0:
        return matched
    ious = bbox_overlaps(torch.as_tensor(boxes, dtype=torch.float64),
                         torch.as_tensor(trees, dtype=torch.float64)).numpy()
    taken = np.zeros(len(trees), dtype=bool)
    for index in np.argsort(-np.asarray(scores), kind='stable'):
        candidates = np.where(taken, -1.0, ious[index])
        best = int(candidates.argmax())
        if candidates[best] >= iou_thr:
            matched[index] = taken[best] = True
    return matched


def read_photograph(paths: Sequence[str], windows: Sequence[Sequence[int]]) -> Tuple[np.ndarray, Tuple[int, int]]:
    """The photograph covered by tiles, pasted from their image files.

    Args:
        paths (sequence): each tile's image file.
        windows (sequence): each tile's (x0, y0, x1, y1) in the photograph.

    Returns:
        tuple: ((H, W, 3) uint8 RGB, the part of the photograph from the tiles' top-left to their bottom-right
        corner; (x0, y0), its top-left corner in the photograph).
    """
    windows = np.asarray(windows, dtype=np.int64).reshape(-1, 4)
    left, top = windows[:, :2].min(axis=0)
    right, bottom = windows[:, 2:].max(axis=0)
    photograph = np.zeros((bottom - top, right - left, 3), dtype=np.uint8)
    covered = np.zeros(photograph.shape[:2], dtype=bool)
    for path, window in zip(paths, windows):
        with Image.open(path) as image:
            tile = np.asarray(image.convert('RGB'))
        x0, y0, x1, y1 = window - [left, top, left, top]
        if tile.shape[:2] != (y1 - y0, x1 - x0):
            raise ValueError(f'{path} is {tile.shape[1]} x {tile.shape[0]} px but its window {window.tolist()} is '
                             f'{x1 - x0} x {y1 - y0} px: the annotation file does not describe these tiles; make '
                             'the dataset again')
        overlap = covered[y0:y1, x0:x1]
        if not np.array_equal(photograph[y0:y1, x0:x1][overlap], tile[overlap]):
            raise ValueError(f'{path} differs from the tiles before it where their windows overlap, so the windows '
                             'do not place the tiles in one photograph; make the dataset again')
        photograph[y0:y1, x0:x1] = tile
        covered[y0:y1, x0:x1] = True
    return photograph, (int(left), int(top))


def predict(config: str, checkpoint: str, paths: Sequence[str], label: str) -> List[Tuple[np.ndarray, np.ndarray]]:
    """One model's boxes and scores on each image, on CPU, as mmdet's inference API gives them.

    Args:
        config (str): the model's config file.
        checkpoint (str): its checkpoint, read weights-only.
        paths (sequence): the image files.
        label (str): the model's name on the progress bar.

    Returns:
        list: per image, ((N, 4) float64 boxes x0 y0 x1 y1 in its pixels, (N,) float64 scores).
    """
    # mmdet.apis imports all of mmdet's models and datasets: imported only where a model runs
    from mmdet.apis import inference_detector, init_detector
    with weights_only_loading():  # also for a config that does not opt in to condtok_mm.compat
        model = init_detector(config, checkpoint, device='cpu')
    found = []
    for path in tqdm(paths, desc=f'{label}: tiles', unit='tile'):
        instances = inference_detector(model, path).pred_instances
        found.append((instances.bboxes.numpy().astype(np.float64), instances.scores.numpy().astype(np.float64)))
    return found


def draw(photograph: np.ndarray, origin: Tuple[int, int], truth: dict, panels: List[dict], caption: str,
         path: str, dpi: int = 100) -> None:
    """Save the photograph with the ground truth, then each model's predictions, side by side.

    Args:
        photograph (np.ndarray): (H, W, 3) image.
        origin (tuple): its top-left corner (x0, y0) in the photograph's coordinates, in which the boxes are.
        truth (dict): ``trees`` and ``ignore`` (N, 4) boxes.
        panels (list): per model a dict of ``title``, ``boxes`` (N, 4) and ``matched`` (N,) bool.
        caption (str): the text under the panels.
        path (str): the PNG to write.
        dpi (int): its resolution; 6 inches a panel. Default: 100.
    """
    height, width = photograph.shape[:2]
    extent = (origin[0], origin[0] + width, origin[1] + height, origin[1])  # boxes' corners are pixel edges
    columns = 1 + len(panels)
    fig, axes = plt.subplots(1, columns, figsize=(6 * columns, 6 * height / width + 1.3), squeeze=False)
    layers = [(f'ground truth: {len(truth["trees"])} trees, {len(truth["ignore"])} ignore regions',
               [(truth['trees'], COLOURS['tree'], '-'), (truth['ignore'], COLOURS['ignore'], '--')])]
    layers += [(panel['title'], [(panel['boxes'][panel['matched']], COLOURS['matched'], '-'),
                                 (panel['boxes'][~panel['matched']], COLOURS['unmatched'], '-')]) for panel in panels]
    for ax, (title, groups) in zip(axes[0], layers):
        ax.imshow(photograph, extent=extent, interpolation='nearest')
        for boxes, colour, style in groups:
            for x0, y0, x1, y1 in boxes:
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linestyle=style,
                                       linewidth=1.2 if style == '--' else 0.7))  # a dash needs more ink to show
        ax.set_title(title, fontsize=10)
        ax.set_axis_off()
    legend = [Line2D([], [], color=COLOURS['tree'], label='tree'),
              Line2D([], [], color=COLOURS['ignore'], linestyle='--', label='ignore region (under half a crown)'),
              Line2D([], [], color=COLOURS['matched'], label=f'prediction matched to a tree (IoU >= {MATCH_IOU})'),
              Line2D([], [], color=COLOURS['unmatched'], label='prediction not matched')]
    fig.legend(handles=legend, loc='lower center', ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.06))
    fig.text(0.5, 0.01, caption, ha='center', va='bottom', fontsize=8, wrap=True)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.93, bottom=0.14, wspace=0.03)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def read_ap(path: str) -> float:
    """The bbox AP (in %) of a tools/test.py metrics file.

    Args:
        path (str): WORK_DIR/<timestamp>/<timestamp>.json of a tools/test.py run.
    """
    with open(path) as f:
        metrics = json.load(f)
    if not isinstance(metrics, dict) or not isinstance(metrics.get('coco/bbox_mAP'), (int, float)):
        raise ValueError(f'{path} holds no number coco/bbox_mAP: give the metrics JSON that tools/test.py writes '
                         '(WORK_DIR/<timestamp>/<timestamp>.json)')
    return 100 * metrics['coco/bbox_mAP']


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Draw detectors\' predictions on a NEON photograph beside its '
                                     'ground truth')
    parser.add_argument('models', nargs='+', metavar='CONFIG CHECKPOINT', help='a config and its checkpoint, for '
                        'each model')
    parser.add_argument('--labels', nargs='+', required=True, help='a name for each model, in the same order')
    parser.add_argument('--out-dir', required=True, help='where SOURCE.png and SOURCE.json go')
    parser.add_argument('--split', default='test', help='the split whose tiles are drawn (default: test)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='the least score of a drawn and counted '
                        'prediction (default: 0.3)')
    parser.add_argument('--data-root', default='data/neon_trees/', help='the dataset folder (default: '
                        'data/neon_trees/)')
    parser.add_argument('--metrics', nargs='+', help='each model\'s tools/test.py metrics JSON on the split, in '
                        'the same order, for the AP in its panel\'s title')
    parser.add_argument('--dpi', type=int, default=100, help='the PNG\'s resolution, 6 inches a panel (default: '
                        '100: 1800 px wide for two models; the crowns\' boxes need more than about 80)')
    args = parser.parse_args(argv)
    if args.dpi < 1:
        parser.error(f'--dpi {args.dpi}: give a positive resolution')
    if len(args.models) % 2:
        parser.error(f'{len(args.models)} paths given: give a CONFIG CHECKPOINT pair for each model')
    args.models = list(zip(args.models[0::2], args.models[1::2]))
    missing = [path for pair in args.models for path in pair if not osp.isfile(path)]
    if missing:
        parser.error(f'no such file: {", ".join(missing)}; give each model\'s config and checkpoint files, in pairs')
    if len(args.labels) != len(args.models) or len(set(args.labels)) != len(args.labels):
        parser.error(f'{len(args.labels)} labels ({" ".join(args.labels)}) for {len(args.models)} models: give one '
                     'distinct label for each CONFIG CHECKPOINT pair')
    if args.metrics is not None and len(args.metrics) != len(args.models):
        parser.error(f'{len(args.metrics)} --metrics files for {len(args.models)} models: give one for each model, '
                     'in the same order')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:  # everything read from files first: a bad split or metrics file fails before the models run
        tiles = read_split(osp.join(args.data_root, 'annotations', f'instances_{args.split}.json'))
        aps = [read_ap(path) for path in args.metrics] if args.metrics else [None] * len(args.models)
        paths = [osp.join(args.data_root, args.split, tile['file_name']) for tile in tiles]
        sources: Dict[str, List[int]] = {}
        for index, tile in enumerate(tiles):
            sources.setdefault(tile['source'], []).append(index)
        photographs = {source: read_photograph([paths[i] for i in indices], [tiles[i]['window'] for i in indices])
                       for source, indices in sources.items()}
    except (OSError, ValueError) as error:
        sys.exit(f'error: {error}')
    predictions = {label: predict(config, checkpoint, paths, label)
                   for label, (config, checkpoint) in zip(args.labels, args.models)}
    os.makedirs(args.out_dir, exist_ok=True)
    for source, indices in sources.items():
        photograph, origin = photographs[source]
        windows = [tiles[i]['window'] for i in indices]
        gt_boxes, gt_crowd = merge_tiles(windows, [tiles[i]['boxes'] for i in indices],
                                         [tiles[i]['iscrowd'] for i in indices])
        truth = dict(trees=gt_boxes[~gt_crowd], ignore=gt_boxes[gt_crowd])
        record = dict(source=source, split=args.split, tiles=len(indices), origin=list(origin),
                      size=[photograph.shape[1], photograph.shape[0]], merge_rule=MERGE_RULE, score_thr=args.score_thr,
                      match_iou=MATCH_IOU, ground_truth={key: value.tolist() for key, value in truth.items()},
                      models={})
        panels = []
        rows = [f'{source} ({args.split}, {len(indices)} tiles): predictions with score >= {args.score_thr}, '
                f'matched to a tree at IoU >= {MATCH_IOU}',
                f'{"label":<24} {"predictions":>11} {"matched":>8} {"trees":>6}']
        for (config, checkpoint), label, ap in zip(args.models, args.labels, aps):
            boxes, scores = merge_tiles(windows, [predictions[label][i][0] for i in indices],
                                        [predictions[label][i][1] for i in indices])
            shown = scores >= args.score_thr
            matched = match(boxes[shown], scores[shown], truth['trees'])
            record['models'][label] = dict(config=config, checkpoint=checkpoint, ap=ap, above_thr=int(shown.sum()),
                                           matched=int(matched.sum()), boxes=boxes.tolist(), scores=scores.tolist())
            title = (f'{label}: {shown.sum()} boxes (score >= {args.score_thr}), {matched.sum()} matched, '
                     f'{len(truth["trees"])} trees' + ('' if ap is None else f'; AP {ap:.1f}'))
            panels.append(dict(title=title, boxes=boxes[shown], matched=matched))
            rows.append(f'{label:<24} {shown.sum():>11} {matched.sum():>8} {len(truth["trees"]):>6}')
        caption = (f'{source}, {args.split} split, reassembled from {len(indices)} tiles. Merge: {MERGE_RULE}. '
                   f'Predictions drawn with score >= {args.score_thr}; matched: IoU >= {MATCH_IOU} to a tree, '
                   'one to one, highest score first.' + (' AP: tools/test.py on the split\'s tiles.' if args.metrics
                                                         else ''))
        draw(photograph, origin, truth, panels, caption, osp.join(args.out_dir, f'{source}.png'), dpi=args.dpi)
        with open(osp.join(args.out_dir, f'{source}.json'), 'w') as f:
            json.dump(record, f, indent=1)
        print('\n'.join(rows))
        print(f'wrote {source}.png and {source}.json in {args.out_dir}')


if __name__ == '__main__':
    main()
