import os.path as osp

from setuptools import find_packages, setup


def read_version():
    namespace = {}
    with open(osp.join(osp.dirname(__file__), 'condtok_mm', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def read_requirements(path):
    with open(osp.join(osp.dirname(__file__), path)) as f:
        return [line.split('#')[0].strip() for line in f if line.split('#')[0].strip()]


setup(
    name='condtok_mm',
    version=read_version(),
    description='Conditioned embedded tokens for MMDetection transformer backbones',
    long_description=open(osp.join(osp.dirname(__file__), 'README.md')).read()
    if osp.exists(osp.join(osp.dirname(__file__), 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('configs', 'tools', 'tests')),
    # configs ship inside the package as condtok_mm/.mim/configs (a symlink to configs/ in the
    # checkout), where OpenMMLab tools look for a package's configs, as mmdet's wheel does.
    # tools/ and model-index.yml ship as condtok_mm/.mim/tools and .mim/model-index.yml (symlinks too), where mim
    # looks for them (`mim train condtok_mm CONFIG`, `mim run condtok_mm plot_conditioning`, `mim search`).
    package_data={'condtok_mm': ['.mim/configs/*.py', '.mim/configs/*/*.py', '.mim/configs/*/*/*.py',
                                 '.mim/configs/*/metafile.yml', '.mim/model-index.yml', '.mim/tools/*.py',
                                 '.mim/tools/*.sh', '.mim/tools/*/*.py']},
    # Syntax checked by tests/test_packaging.py; the versions verified at run time: Python 3.11 with
    # requirements/constraints.txt.
    python_requires='>=3.8',
    install_requires=read_requirements('requirements/runtime.txt'),
    extras_require={
        'mmpretrain': read_requirements('requirements/mmpretrain.txt'),
        'coco': read_requirements('requirements/coco.txt'),
        'analysis': read_requirements('requirements/analysis.txt'),
        'seg': read_requirements('requirements/seg.txt'),
        'tensorboard': read_requirements('requirements/tensorboard.txt'),
        'deploy': read_requirements('requirements/deploy.txt'),
        'tests': read_requirements('requirements/tests.txt'),
    },
    license='Apache License 2.0',
    zip_safe=False,
)
