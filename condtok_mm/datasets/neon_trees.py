"""Tree crowns in NEON airborne RGB orthophotos (10 cm pixels), tiled into a COCO-format detection dataset.

The source is the sample data that ships inside the deepforest 2.1.0 wheel (MIT licence, Copyright (c) 2019 Ben
Weinstein; ``deepforest/data/``): four PNG images with Pascal-VOC box files. The wheel is read as a zip archive;
nothing in it is imported or executed, and a VOC file that declares a DOCTYPE (the door to entity expansion) is
refused.

Splits, by source image (never by tile):

* ``train``: tiles of 2019_YELL_2_528000_4978000_image_crop2 (2299 x 2472, 574 trees) above its guard band;
* ``val``: tiles of the bottom ``val_rows`` rows of that same image, below a ``guard`` band of rows that no tile
  covers. The validation part is taken from the training image's site and flight (Yellowstone, the test image's
  site, 13 km away) so that a learning rate chosen on it is chosen for the test's kind of scene; the other sites'
  images are annotated to other rules (SOAP_061 marks 28 dead and 9 living crowns of a dense forest, most living
  crowns unmarked) and would score a detector on their labelling, not on trees. A box that meets both the
  training and the validation part is refused (the guard band must be wider than every crown: 128 rows against
  the largest crown's 107).
* ``test``: tiles of 2019_YELL_2_541000_4977000_image_crop (1249 x 1035, 279 trees), held out from every choice;
* ``other_sites``: OSBS_029 and SOAP_061 (400 x 400 each), never trained on nor chosen on; SOAP's ``Dead`` and
  ``Alive`` are merged into the one class ``tree`` (the merge is recorded in each annotation file's ``info``).

Tiling: square windows of ``tile`` pixels, neighbours overlapping by ``overlap`` pixels (stride ``tile - overlap``);
the last window of a row or column is moved back to end at the image's (or part's) edge, so every tile has the
full size and every pixel of the part is covered. A part narrower than ``tile`` is one window of its own size.
Tiles without a tree are kept (they are where false positives are made; mmdet's training loader, with its
default ``filter_empty_gt``, leaves out the ones that hold no annotation at all).

Box clipping: each box (VOC corners taken as pixel edges, 0 <= xmin < xmax <= width) is intersected with the
window. A part with at least ``min_visible`` of the box's area is a tree (``iscrowd`` 0); a smaller part is an
ignore region (``iscrowd`` 1: COCO evaluation neither rewards nor penalises a detection there; mmdet never
learns it as a tree, and with its assigners' default ``ignore_iof_thr=-1`` it may sample anchors and proposals
over it as background); a part thinner than 1 pixel is dropped (mmdet skips such boxes).
"""
import hashlib
import io
import json
import os
import os.path as osp
import shutil
import xml.etree.ElementTree as ET
import zipfile
from typing import Dict, List, Tuple

from PIL import Image

WHEEL_NAME = 'deepforest-2.1.0-py3-none-any.whl'
WHEEL_SHA256 = '8c2798d8e9be7f0004b194fe207b76c1d9fff6e711b3db67b9508dcd5d00ae54'
DATA_PREFIX = 'deepforest/data/'
LICENSE_MEMBER = 'deepforest-2.1.0.dist-info/licenses/LICENSE'
SOURCE_URL = 'https://github.com/weecology/DeepForest'
TRAIN_IMAGE = '2019_YELL_2_528000_4978000_image_crop2'
TEST_IMAGE = '2019_YELL_2_541000_4977000_image_crop'
OTHER_SITE_IMAGES = ('OSBS_029', 'SOAP_061')
SPLITS = ('train', 'val', 'test', 'other_sites')
CLASSES = ('tree', )
# one class: only SOAP tells dead crowns from live ones, and no other image could teach the difference
CLASS_MERGE = {'Tree': 'tree', 'Dead': 'tree', 'Alive': 'tree'}
MANIFEST = 'manifest.json'


def sha256_of(path: str) -> str:
    """The SHA-256 hex digest of the file at ``path``.

    Args:
        path (str): the file.
    """
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def check_wheel(path: str, expected: str = WHEEL_SHA256) -> None:
    """Refuse a wheel whose SHA-256 is not the pinned one (another build, a truncated download, a tampered file).

    Args:
        path (str): the wheel file.
        expected (str): the SHA-256 it must have. Default: deepforest 2.1.0's.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path}: no such wheel; fetch it with `pip download --no-deps '
                                f'--only-binary=:all: deepforest==2.1.0 -d DIR`')
    actual = sha256_of(path)
    if actual != expected:
        raise ValueError(f'{path}: SHA-256 {actual}, not the pinned {expected} of {WHEEL_NAME}; this is another '
                         'file: delete it and fetch deepforest==2.1.0 again (or give --wheel the right file)')


def read_voc(data: bytes, name: str) -> Tuple[int, int, List[Tuple[str, Tuple[float, float, float, float]]]]:
    """Parse one Pascal-VOC annotation file.

    Args:
        data (bytes): the file's content.
        name (str): its name, for the error messages.

    Returns:
        tuple: (width, height, [(label, (xmin, ymin, xmax, ymax)), ...]) with the corners as pixel edges.
    """
    upper = data.upper()
    if b'<!DOCTYPE' in upper or b'<!ENTITY' in upper:
        raise ValueError(f'{name}: declares a DOCTYPE or ENTITY; a VOC annotation file needs neither, and entities '
                         'can expand without bound, so it is not read')
    root = ET.fromstring(data)
    try:
        width, height = (int(root.find('size').find(key).text) for key in ('width', 'height'))
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f'{name}: no integer <size><width>/<height>') from None
    objects = []
    for index, obj in enumerate(root.findall('object')):
        label = (obj.findtext('name') or '').strip()
        if label not in CLASS_MERGE:
            raise ValueError(f'{name}: object {index} has the label {label!r}; the known labels are '
                             f'{sorted(CLASS_MERGE)}')
        try:
            box = tuple(float(obj.find('bndbox').find(key).text) for key in ('xmin', 'ymin', 'xmax', 'ymax'))
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f'{name}: object {index} has no numeric <bndbox> xmin/ymin/xmax/ymax') from None
        xmin, ymin, xmax, ymax = box
        if not (0 <= xmin < xmax <= width and 0 <= ymin < ymax <= height):
            raise ValueError(f'{name}: object {index} has the box {box}, not inside the {width} x {height} image '
                             'with xmin < xmax and ymin < ymax')
        objects.append((label, box))
    return width, height, objects


def tile_origins(length: int, tile: int, overlap: int) -> List[int]:
    """The start of each window along one axis of ``length`` pixels (the rule in the module's docstring).

    Args:
        length (int): the axis' length in pixels.
        tile (int): the window's side.
        overlap (int): the overlap of neighbouring windows, ``0 <= overlap < tile``.
    """
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile + 1, tile - overlap))
    if starts[-1] != length - tile:
        starts.append(length - tile)
    return starts


def clip_box(box: Tuple[float, float, float, float], window: Tuple[int, int, int, int],
             min_visible: float) -> Tuple[List[float], int]:
    """The part of ``box`` inside ``window`` as a COCO box in the window's coordinates, and its ``iscrowd``.

    Args:
        box (tuple): (xmin, ymin, xmax, ymax) in the image.
        window (tuple): (x0, y0, x1, y1) in the image.
        min_visible (float): the least fraction of the box's area inside the window for it to count as a tree.

    Returns:
        tuple: ([x, y, w, h], iscrowd), or (None, None) where less than 1 pixel of width or height is inside.
    """
    x0, y0, x1, y1 = window
    left, top = max(box[0], x0), max(box[1], y0)
    right, bottom = min(box[2], x1), min(box[3], y1)
    if right - left < 1 or bottom - top < 1:
        return None, None
    visible = (right - left) * (bottom - top) / ((box[2] - box[0]) * (box[3] - box[1]))
    return [left - x0, top - y0, right - left, bottom - top], int(visible < min_visible)


def split_parts(height: int, val_rows: int, guard: int) -> Dict[str, Tuple[int, int]]:
    """The rows [top, bottom) of the training image that the training and the validation tiles come from.

    Args:
        height (int): the training image's height.
        val_rows (int): the rows at its bottom that are the validation part.
        guard (int): the rows between the two parts that no tile covers.
    """
    train_bottom = height - val_rows - guard
    if val_rows < 1 or guard < 0 or train_bottom < 1:
        raise ValueError(f'val_rows={val_rows}, guard={guard}: the training image has {height} rows; the validation '
                         'part needs at least 1 row, the guard band at least 0, and the training part the rest '
                         '(at least 1 row)')
    return dict(train=(0, train_bottom), val=(height - val_rows, height))


def _tiles(image: Image.Image, boxes, rows: Tuple[int, int], tile: int, overlap: int, min_visible: float):
    """Yield (window, crop, [(bbox, iscrowd), ...]) for the tiles of the rows [top, bottom) of ``image``."""
    top, bottom = rows
    side_x, side_y = min(tile, image.width), min(tile, bottom - top)
    for y in tile_origins(bottom - top, tile, overlap):
        for x in tile_origins(image.width, tile, overlap):
            window = (x, top + y, x + side_x, top + y + side_y)
            parts = [clip_box(box, window, min_visible) for _, box in boxes]
            yield window, image.crop(window), [p for p in parts if p[0] is not None]


def _read_source(archive: zipfile.ZipFile, stem: str):
    """The RGB image and the VOC boxes of ``deepforest/data/STEM.{png,xml}``, their sizes checked."""
    width, height, boxes = read_voc(archive.read(f'{DATA_PREFIX}{stem}.xml'), f'{stem}.xml')
    image = Image.open(io.BytesIO(archive.read(f'{DATA_PREFIX}{stem}.png')))
    image.load()
    if image.size != (width, height):
        raise ValueError(f'{stem}.png is {image.width} x {image.height} but {stem}.xml says {width} x {height}')
    return image.convert('RGB'), boxes


def _check_guard(boxes, parts: Dict[str, Tuple[int, int]], guard: int) -> None:
    """Refuse a box that reaches into both the training and the validation part (a crown seen by both)."""
    for label, box in boxes:
        if box[1] < parts['train'][1] and box[3] > parts['val'][0]:
            raise ValueError(f'{TRAIN_IMAGE}.xml: the {label} box {box} lies in both the training rows '
                             f'{parts["train"]} and the validation rows {parts["val"]}; give a guard band wider than '
                             f'{guard} rows')


def build(wheel: str, root: str, tile: int = 400, overlap: int = 0, val_rows: int = 400, guard: int = 128,
          min_visible: float = 0.5) -> Dict[str, Dict[str, int]]:
    """Write ``root/{train,val,test,other_sites}/*.png``, ``root/annotations/instances_SPLIT.json`` and
    ``root/LICENSE`` (the source's MIT licence) from the wheel; the wheel's digest is not checked here.

    Args:
        wheel (str): the deepforest 2.1.0 wheel.
        root (str): output folder (created; files already there are overwritten).
        tile (int): the tiles' side in pixels. Default: 400.
        overlap (int): the overlap of neighbouring tiles in pixels. Default: 0.
        val_rows (int): the rows at the bottom of the training image that are the validation part. Default: 400.
        guard (int): the rows above them that no tile covers. Default: 128.
        min_visible (float): the least visible fraction of a box's area for it to be a tree in a tile (a smaller
            part is an ignore region). Default: 0.5.

    Returns:
        dict: split -> counts (tiles, empty_tiles, boxes, ignore_regions, source_images).
    """
    if not 0 <= overlap < tile:
        raise ValueError(f'overlap={overlap}, tile={tile}: the overlap must be at least 0 and less than the tile')
    if not 0 < min_visible <= 1:
        raise ValueError(f'min_visible={min_visible}: a fraction of the box area in (0, 1]')
    with zipfile.ZipFile(wheel) as archive:
        sources = {stem: _read_source(archive, stem) for stem in (TRAIN_IMAGE, TEST_IMAGE) + OTHER_SITE_IMAGES}
        licence = archive.read(LICENSE_MEMBER)
    train_image, train_boxes = sources[TRAIN_IMAGE]
    parts = split_parts(train_image.height, val_rows, guard)
    _check_guard(train_boxes, parts, guard)
    plan = dict(train=[(TRAIN_IMAGE, parts['train'])], val=[(TRAIN_IMAGE, parts['val'])],
                test=[(TEST_IMAGE, (0, sources[TEST_IMAGE][0].height))],
                other_sites=[(stem, (0, sources[stem][0].height)) for stem in OTHER_SITE_IMAGES])
    labels = {stem: sorted({label for label, _ in boxes}) for stem, (_, boxes) in sources.items()}
    info = dict(
        description='Tree crowns in NEON airborne RGB orthophotos (10 cm pixels), tiled; condtok_mm',
        source=f'{WHEEL_NAME} (SHA-256 {WHEEL_SHA256}), {DATA_PREFIX}; {SOURCE_URL}',
        licence='MIT, Copyright (c) 2019 Ben Weinstein (LICENSE beside the annotations)',
        class_merge={label: CLASS_MERGE[label] for label in sorted({lb for v in labels.values() for lb in v})},
        source_labels=labels,
        tiling=dict(tile=tile, overlap=overlap, min_visible=min_visible, val_rows=val_rows, guard=guard,
                    training_image_rows=parts))
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    with open(osp.join(root, 'LICENSE'), 'wb') as f:
        f.write(licence)
    counts = {}
    for split in SPLITS:
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, annotations = [], []
        for stem, rows in plan[split]:
            image, boxes = sources[stem]
            for window, crop, instances in _tiles(image, boxes, rows, tile, overlap, min_visible):
                file_name = f'{stem}_x{window[0]:04d}_y{window[1]:04d}.png'
                crop.save(osp.join(root, split, file_name))
                image_id = len(images) + 1
                images.append(dict(id=image_id, file_name=file_name, width=crop.width, height=crop.height,
                                   license=1, source=stem, window=list(window)))
                for bbox, iscrowd in instances:
                    annotations.append(dict(id=len(annotations) + 1, image_id=image_id, category_id=1, bbox=bbox,
                                            area=bbox[2] * bbox[3], iscrowd=iscrowd))
        coco = dict(info=dict(info, split=split), licenses=[dict(id=1, name='MIT', url=SOURCE_URL)],
                    images=images, annotations=annotations,
                    categories=[dict(id=1, name=CLASSES[0], supercategory='plant')])
        with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(coco, f, indent=1, sort_keys=True)
        with_trees = {a['image_id'] for a in annotations if not a['iscrowd']}
        counts[split] = dict(tiles=len(images), empty_tiles=len(images) - len(with_trees),
                             boxes=sum(not a['iscrowd'] for a in annotations),
                             ignore_regions=sum(a['iscrowd'] for a in annotations), source_images=len(plan[split]))
    return counts


def file_digests(root: str) -> Dict[str, str]:
    """The SHA-256 of every file under ``root`` but the manifest, by path relative to ``root``.

    Args:
        root (str): the dataset folder.
    """
    digests = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = osp.join(folder, name)
            relative = osp.relpath(path, root).replace(os.sep, '/')
            if relative != MANIFEST:
                digests[relative] = sha256_of(path)
    return dict(sorted(digests.items()))


def make_neon_trees_dataset(wheel: str, root: str, force: bool = False, sha256: str = WHEEL_SHA256,
                            **options) -> Tuple[Dict, bool]:
    """Check the wheel's digest and write the dataset to ``root`` unless the same one is already there.

    ``root/manifest.json`` records the wheel's digest, the options, the counts and the SHA-256 of every file. A
    folder whose manifest has the same wheel and options and whose files all match it is left untouched; a
    folder made with other options is refused unless ``force``; a folder with changed or missing files is made
    again. The dataset is built in a sibling folder and moved into place, so ``root`` never holds half of one.

    Args:
        wheel (str): the deepforest 2.1.0 wheel.
        root (str): the dataset folder.
        force (bool): rewrite a dataset made with other options. Default: False.
        sha256 (str): the digest the wheel must have. Default: deepforest 2.1.0's (the tests give their own
            archive's).
        **options: :func:`build`'s tile, overlap, val_rows, guard, min_visible.

    Returns:
        tuple: (the manifest, whether files were written).
    """
    check_wheel(wheel, sha256)
    options = dict(dict(tile=400, overlap=0, val_rows=400, guard=128, min_visible=0.5), **options)
    manifest_path = osp.join(root, MANIFEST)
    if osp.exists(root):
        if not osp.isfile(manifest_path):
            if os.listdir(root):
                raise FileExistsError(f'{root} exists and holds no {MANIFEST}: it is not a dataset this tool '
                                      'wrote; give another output folder')
        else:
            with open(manifest_path) as f:
                manifest = json.load(f)
            if manifest['options'] != options and not force:
                raise FileExistsError(f'{root} holds the dataset made with {manifest["options"]}, not {options}; '
                                      'give another output folder or force (--force) to rewrite it')
            if (manifest['options'], manifest['wheel_sha256']) == (options, sha256) \
                    and manifest['files'] == file_digests(root):
                return manifest, False
    staging = root.rstrip('/\\') + '.partial'
    shutil.rmtree(staging, ignore_errors=True)
    counts = build(wheel, staging, **options)
    manifest = dict(wheel=osp.basename(wheel), wheel_sha256=sha256, options=options, counts=counts,
                    files=file_digests(staging))
    with open(osp.join(staging, MANIFEST), 'w') as f:
        json.dump(manifest, f, indent=1)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(staging, root)
    return manifest, True
