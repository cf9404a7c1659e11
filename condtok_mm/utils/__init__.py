from .runtime import check_dataset_files, fall_back_from_amp_on_cpu

__all__ = ['check_dataset_files', 'fall_back_from_amp_on_cpu']
