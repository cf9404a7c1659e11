"""The opt-in (condtok_mm.compat.apply) and the weights_only_loading blocks of condtok_mm's modules, in two threads in
any order: once apply() has run, every checkpoint scheme stays weights-only whenever the blocks end, and a block
that ends puts back mmengine's loaders only where its own are still in place."""
import queue
import threading
from collections import OrderedDict

import pytest
from mmengine.runner import checkpoint as checkpoint_module
from mmengine.runner.checkpoint import CheckpointLoader

from condtok_mm import compat
from condtok_mm.compat import checkpoint_loading
from condtok_mm.compat.checkpoint_loading import SCHEMES, weights_only_loading



class Steps(threading.Thread):
    """A thread that takes one step at a time when told to, so that two of them interleave in a set order:
    'enter' and 'exit' a weights_only_loading block (nested in its earlier ones), 'apply' condtok_mm.compat."""

    def __init__(self):
        super().__init__(daemon=True)
        self.steps, self.done = queue.Queue(), queue.Queue()

    def run(self):
        blocks = []
        for step in iter(self.steps.get, None):
            try:
                if step == 'enter':
                    blocks.append(weights_only_loading())
                    blocks[-1].__enter__()
                elif step == 'exit':
                    blocks.pop().__exit__(None, None, None)
                else:
                    compat.apply()
                self.done.put(None)
            except BaseException as error:  # raised in the test's thread
                self.done.put(error)

    def take(self, step):
        self.steps.put(step)
        error = self.done.get(timeout=60)
        if error is not None:
            raise error


@pytest.fixture
def host(monkeypatch):
    """A process that has not opted in: mmengine's schemes hold the host's own loaders (one object a prefix),
    condtok_mm.compat has applied every fix but the checkpoint loaders, and no block is open."""
    schemes = OrderedDict((prefix, lambda filename, map_location=None: None) for prefix in CheckpointLoader._schemes)
    monkeypatch.setattr(CheckpointLoader, '_schemes', schemes)
    monkeypatch.setattr(checkpoint_module, 'load_from_http', lambda filename, map_location=None: None)
    monkeypatch.setattr(compat, '_applied', {fix.name for fix in compat.FIXES} - {'checkpoint_loading'})
    monkeypatch.setattr(checkpoint_loading, '_outer_loaders', None)
    assert checkpoint_loading._weights_only_depth == 0
    threads = dict(A=Steps(), B=Steps())
    for thread in threads.values():
        thread.start()
    yield dict(schemes, http=checkpoint_module.load_from_http), threads
    for thread in threads.values():
        thread.steps.put(None)
        thread.join(timeout=60)


def installed():
    return (all(CheckpointLoader._schemes[prefix] is loader for prefix, loader in SCHEMES.items())
            and checkpoint_module.load_from_http is checkpoint_loading.load_from_http)


@pytest.mark.parametrize('order', [
    'A enter, B apply, A exit',
    'A enter, B enter, B apply, B exit, A exit',
    'A enter, B enter, B apply, A exit, B exit',
    'A enter, B enter, A apply, A exit, B exit',
    'A enter, A enter, B apply, A exit, A exit',
    'A enter, B apply, B enter, A exit, B exit',
    'B apply, A enter, A exit',
    'A enter, A exit, B apply',
])
def test_the_opt_in_holds_whenever_the_blocks_of_another_thread_end(host, order):
    _, threads = host
    applied = False
    for thread, step in (part.split() for part in order.split(', ')):
        threads[thread].take(step)
        applied = applied or step == 'apply'
        assert installed() or not applied, f'the opt-in was undone at {thread} {step} of {order}'
    assert installed()
    assert 'checkpoint_loading' in compat.apply()


@pytest.mark.parametrize('order', ['A enter, A exit', 'A enter, B enter, A exit, B exit',
                                   'A enter, A enter, B enter, A exit, B exit, A exit'])
def test_without_the_opt_in_the_last_block_to_end_restores_the_hosts_loaders(host, order):
    loaders, threads = host
    for thread, step in (part.split() for part in order.split(', ')):
        threads[thread].take(step)
        assert installed() == (checkpoint_loading._weights_only_depth > 0)
    assert CheckpointLoader._schemes == {prefix: loaders[prefix] for prefix in CheckpointLoader._schemes}
    assert CheckpointLoader._schemes.keys() == loaders.keys() - {'http'}
    assert checkpoint_module.load_from_http is loaders['http']


def test_a_loader_the_host_registers_during_a_block_stays_after_it(host):
    loaders, threads = host

    def own_local(filename, map_location=None):
        return None

    def own_scheme(filename, map_location=None):
        return None

    threads['A'].take('enter')
    CheckpointLoader.register_scheme('', own_local, force=True)  # the host, in its own thread
    CheckpointLoader.register_scheme('own://', own_scheme)
    threads['A'].take('exit')
    assert CheckpointLoader._schemes[''] is own_local and CheckpointLoader._schemes['own://'] is own_scheme
    assert all(CheckpointLoader._schemes[prefix] is loaders[prefix] for prefix in SCHEMES if prefix != '')
    assert checkpoint_module.load_from_http is loaders['http']
