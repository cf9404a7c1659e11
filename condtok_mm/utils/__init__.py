from .machine import describe_machine, machine_summary, timed, usable_cpus
from .runtime import check_dataset_files, check_vis_backends, fall_back_from_amp_on_cpu

__all__ = ['check_dataset_files', 'check_vis_backends', 'describe_machine', 'fall_back_from_amp_on_cpu',
           'machine_summary', 'timed', 'usable_cpus']
