"""The files that ship beside the package, where the tools find them: condtok_mm/.mim/configs and .mim/tools (in
a checkout, a source or editable install, links to its configs/ and tools/; a wheel holds copies)."""
import os.path as osp

PACKAGE_FILES = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), '.mim')


def package_file(relative: str) -> str:
    """The path of ``relative`` (e.g. 'configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py') under condtok_mm/.mim.

    Args:
        relative (str): a path relative to the repository root, under configs/ or tools/.
    """
    return osp.join(PACKAGE_FILES, relative)


def package_root() -> str:
    """The folder that holds the imported package's configs/ and tools/: the checkout it is imported from (a source
    or editable install), or condtok_mm/.mim (a wheel)."""
    return osp.dirname(osp.realpath(package_file('tools')))
