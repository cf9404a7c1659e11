"""The front page and docs/en/ name only things that exist.

Every markdown link (file and, for a markdown target, its heading anchor) and every repo path named (configs/...,
tools/..., docs/..., condtok_mm/..., tests/..., in code or prose; resolved from the repo root) of README.md,
docs/en/**/*.md and configs/*/README.md must exist; every `make TARGET` written in code must be a target of the
Makefile; README.md stays a front page (at most 220 lines). work_dirs/, data/ and placeholders (CONFIG, <name>,
...) are outputs or stand-ins, not repo paths, and are not checked.
"""
import glob
import itertools
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
README_MAX_LINES = 220

REPO_PATH = re.compile(r'(?<![\w./~-])(?:configs|tools|docs|condtok_mm|tests|requirements|\.ci)/[\w.{},*+/-]*')
MAKE_TARGET = re.compile(r'(?:^|[\s;&|(`])make\s+(?:-\S+\s+)*([A-Za-z][\w-]*)')
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
FENCE = re.compile(r'^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$', re.S | re.M)
INLINE_CODE = re.compile(r'`([^`\n]+)`')
PLACEHOLDER = re.compile(r'<|>|\.\.\.|…|\b(?:CONFIG|CHECKPOINT|SUITE|VARIANT|METHOD|WORK_DIR|OUT_DIR|'
                         r'PARTITION|JOB_NAME)\b')


def doc_files(root=REPO_ROOT):
    """README.md, every page under docs/en/ and every config folder's README, as paths."""
    files = [osp.join(root, 'README.md')]
    files += sorted(glob.glob(osp.join(root, 'docs', 'en', '**', '*.md'), recursive=True))
    files += sorted(glob.glob(osp.join(root, 'configs', '*', 'README.md')))
    return files


def code_spans(text):
    """The text of every fenced block and every inline code span (inline spans outside the fences)."""
    fenced = [m.group(2) for m in FENCE.finditer(text)]
    prose = FENCE.sub('', text)
    return fenced + INLINE_CODE.findall(prose)


def brace_expand(path):
    """`a{,-b}c` -> ['ac', 'a-bc'] (shell brace expansion, any number of groups, not nested)."""
    parts = re.split(r'\{([^{}]*)\}', path)
    literals, choices = parts[0::2], [group.split(',') for group in parts[1::2]]
    expanded = []
    for combo in itertools.product(*choices):
        expanded.append(''.join(lit + alt for lit, alt in zip(literals, combo + ('', ))))
    return expanded


def repo_paths(text):
    """Repo-relative paths a page names (in code or prose), placeholders left out, trailing punctuation cut."""
    paths = set()
    for match in REPO_PATH.finditer(text):
        path = match.group(0).rstrip('.,:;')
        following = text[match.end():match.end() + 1]
        if PLACEHOLDER.search(path) or following in ('<', '$'):
            continue
        paths.add(path)
    return sorted(paths)


def missing_paths(text, root=REPO_ROOT):
    missing = []
    for path in repo_paths(text):
        for candidate in brace_expand(path):
            if not glob.glob(osp.join(root, candidate)):
                missing.append(candidate)
    return missing


def github_anchor(heading, seen):
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to '-', '-N' for repeats."""
    text = re.sub(r'`|\*\*|\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip()).lower()
    slug = re.sub(r'[^\w\- ]', '', text).replace(' ', '-')
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else f'{slug}-{count}'


def anchors(markdown_file):
    text = FENCE.sub('', open(markdown_file, encoding='utf-8').read())
    seen = {}
    return {github_anchor(m.group(1), seen) for m in re.finditer(r'^#{1,6}\s+(.+?)\s*#*\s*$', text, re.M)}


def broken_links(markdown_file, text):
    """Links of a page whose target file, or heading anchor in a markdown target, does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub('', text)):
        if re.match(r'[a-z]+:', target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition('#')
        resolved = (osp.normpath(osp.join(osp.dirname(markdown_file), file_part)) if file_part else markdown_file)
        if not osp.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
            broken.append(target)
    return broken


def makefile_targets(root=REPO_ROOT):
    text = open(osp.join(root, 'Makefile')).read()
    return set(re.findall(r'^([A-Za-z][\w-]*)\s*:(?!=)', text, re.M))


def make_targets(text):
    return sorted({target for span in code_spans(text) for target in MAKE_TARGET.findall(span)})


def test_the_pages_checked_include_the_docs_index_and_pages():
    files = doc_files()
    assert osp.join(REPO_ROOT, 'docs', 'en', 'index.md') in files
    assert len(files) > 10, files


@pytest.mark.parametrize('markdown_file', doc_files(), ids=lambda p: osp.relpath(p, REPO_ROOT))
def test_every_path_named_exists(markdown_file):
    text = open(markdown_file, encoding='utf-8').read()
    assert missing_paths(text) == [], markdown_file
    assert broken_links(markdown_file, text) == [], markdown_file


@pytest.mark.parametrize('markdown_file', doc_files(), ids=lambda p: osp.relpath(p, REPO_ROOT))
def test_every_make_target_named_is_in_the_makefile(markdown_file):
    named = make_targets(open(markdown_file, encoding='utf-8').read())
    assert set(named) - makefile_targets() == set(), markdown_file


def test_readme_is_a_front_page():
    with open(osp.join(REPO_ROOT, 'README.md'), encoding='utf-8') as f:
        assert len(f.read().splitlines()) <= README_MAX_LINES


def test_the_checks_see_what_is_wrong(tmp_path):
    # the checks themselves: a doctored page names a renamed config, a missing make target, a dead link and
    # anchor, and a brace group with one wrong member; placeholders and outputs are left alone
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'real.md').write_text('# Real heading\n')
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'a-condtok.py').write_text('')
    (tmp_path / 'configs' / 'a.py').write_text('')
    page = tmp_path / 'page.md'
    text = ('Train `configs/a{,-condtok}.py` and `configs/b{,-condtok}.py`; see [x](docs/real.md#real-heading), '
            '[y](docs/real.md#gone), [z](docs/gone.md).\n\n```bash\nmake demo && make nonsense\n'
            'python tools/train.py configs/CONFIG.py --work-dir work_dirs/x data/coco/\n```\n')
    page.write_text(text)
    assert missing_paths(text, root=str(tmp_path)) == ['configs/b.py', 'configs/b-condtok.py', 'docs/gone.md',
                                                       'tools/train.py']
    assert broken_links(str(page), text) == ['docs/real.md#gone', 'docs/gone.md']
    assert make_targets(text) == ['demo', 'nonsense']
    assert {'demo', 'test', 'test-quick', 'gpu-check'} <= makefile_targets()
    assert 'nonsense' not in makefile_targets()


def quoted_output(page, command):
    """The fenced block that follows the first mention of ``command`` on ``page``: what the page says it prints."""
    text = open(osp.join(REPO_ROOT, page), encoding='utf-8').read()
    return FENCE.search(text, text.index(command)).group(2)




NUMBER = re.compile(r'\d+(?:\.(\d+))?')


def agree_to_the_printed_digits(printed, quoted):
    """Whether two outputs are one text with the same numbers, each within one unit of the quoted number's last
    printed digit (a rounding that falls the other way); integers exactly."""
    if NUMBER.sub('#', printed) != NUMBER.sub('#', quoted):
        return False

    def unit(want):  # the quoted number's last printed digit, with room for the float round-off of a difference
        return 1.001 * 10.0**-len(want.group(1)) if want.group(1) else 0

    return all(abs(float(got.group(0)) - float(want.group(0))) <= unit(want)
               for got, want in zip(NUMBER.finditer(printed), NUMBER.finditer(quoted)))


def test_numbers_agree_to_the_printed_digits_and_the_text_exactly():
    assert agree_to_the_printed_digits('kappa 1.999935, 16.2 % of 1024', 'kappa 1.999934, 16.3 % of 1024')
    assert not agree_to_the_printed_digits('kappa 1.999934', 'kappa 2.000000')
    assert not agree_to_the_printed_digits('16.1 %', '16.3 %')
    assert not agree_to_the_printed_digits('of 1025', 'of 1024')
    assert not agree_to_the_printed_digits('gram 2.0', 'svd 2.0')


@pytest.mark.slow
def test_the_conditioning_facts_script_prints_what_the_conditioning_page_quotes(tmp_path):
    script = 'docs/en/user_guides/conditioning_facts.py'
    printed = subprocess.run([sys.executable, osp.join(REPO_ROOT, script)], cwd=tmp_path, capture_output=True,
                             text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert printed.returncode == 0, printed.stderr[-2000:]
    quoted = quoted_output('docs/en/user_guides/conditioning.md', script)
    assert agree_to_the_printed_digits(printed.stdout, quoted), (printed.stdout, quoted)


def test_the_checkpoints_kept_under_docs_are_the_ones_a_suite_reads_and_the_records_readme_names():
    kept = sorted(osp.relpath(path, REPO_ROOT)
                  for path in glob.glob(osp.join(REPO_ROOT, 'docs', '**', '*.pth'), recursive=True))
    suites = ''.join(open(path).read() for path in glob.glob(osp.join(REPO_ROOT, 'configs', 'suites', '*.py')))
    records = osp.join('docs', 'en', 'studies', 'records')
    readme = open(osp.join(REPO_ROOT, records, 'README.md'), encoding='utf-8').read()
    for path in kept:
        assert path in suites, f'{path} is read by no suite: say why it is kept, or remove it'
        assert f'`{osp.relpath(osp.dirname(path), records)}/`' in readme, f'{records}/README.md does not name {path}'
