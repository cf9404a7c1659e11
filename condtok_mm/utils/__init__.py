from .amp_fallback import fall_back_from_amp_on_cpu
from .dataset_files import DatasetNotFoundError, check_dataset_files
from .extras import MissingExtraError, check_vis_backends
from .machine import describe_machine, machine_summary, timed, usable_cpus
from .whole_files import write_whole, write_whole_text

__all__ = ['DatasetNotFoundError', 'MissingExtraError', 'check_dataset_files', 'check_vis_backends',
           'describe_machine', 'fall_back_from_amp_on_cpu', 'machine_summary', 'timed', 'usable_cpus', 'write_whole',
           'write_whole_text']
