"""The derived tables a loaded `Run` serves (DerivedTables, a base of
diagnose.analysis.load.loader.Run): collectives and arrivals, the FSDP units'
communication, and the device tables of imported Kineto / Nsight traces
(definitions in diagnose/analysis/tables/), each computed on first use and kept
by its run (per_run)."""

import functools

import pandas as pd


def per_run(method):
    """A derived table computed on first use and kept by its run, and freed with it:
    functools.lru_cache on a method keeps every run it saw alive in a cache of its
    class (16,384 ranks analyzed in 4 windows, one after the other: 13 GB at the
    peak instead of one window's ~5.7 GB)."""
    key = f"_table_{method.__name__}"

    @functools.wraps(method)
    def cached(self):
        if key not in self.__dict__:
            self.__dict__[key] = method(self)
        return self.__dict__[key]

    return cached


class DerivedTables:
    """Run's derived tables, from its events, steps and windows (Run's own methods)."""

    @per_run
    def collectives(self) -> pd.DataFrame:
        from diagnose.analysis.tables.matching import collectives_table

        return collectives_table(self._events)

    @per_run
    def arrivals(self) -> pd.DataFrame:
        from diagnose.analysis.tables.matching import arrivals_table

        return arrivals_table(self.collectives())

    @per_run
    def core_wait(self) -> pd.DataFrame:
        from diagnose.analysis.tables.run_delay import core_wait_per_step

        return core_wait_per_step(self._events)

    # GPU tables (imported Kineto / Nsight traces): definitions in diagnose/analysis/tables/gpu_tables.py
    # and device_idle.py
    @per_run
    def kernels(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import kernels_table

        return kernels_table(self._events)

    @per_run
    def temporal_breakdown(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import temporal_breakdown

        return temporal_breakdown(self.kernels(), self.in_window(self.steps()))

    @per_run
    def device_compute(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import device_compute

        return device_compute(self.kernels())

    @per_run
    def device_compute_spans(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import device_compute_spans

        return device_compute_spans(self._events)

    @per_run
    def device_exposed_comm(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import device_exposed_comm

        return device_exposed_comm(self.kernels())

    @per_run
    def comm_comp_overlap(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import comm_comp_overlap

        return comm_comp_overlap(self.kernels(), self.in_window(self.steps()))

    @per_run
    def device_idle_behind_syncs(self) -> pd.DataFrame:
        from diagnose.analysis.tables.device_idle import device_idle_behind_syncs

        return device_idle_behind_syncs(self._events, self.kernels())

    @per_run
    def device_step_breakdown(self) -> pd.DataFrame:
        from diagnose.analysis.tables.gpu_tables import device_step_breakdown

        return device_step_breakdown(self.kernels(), self.in_window(self.steps()))

    @per_run
    def fsdp_unit_comm(self) -> pd.DataFrame:
        from diagnose.analysis.tables.fsdp_units import fsdp_unit_comm

        return fsdp_unit_comm(self.collectives(), self.steady_steps())

    @per_run
    def device_data_wait(self) -> pd.DataFrame:
        from diagnose.analysis.tables.device_idle import device_data_wait

        return device_data_wait(self._events, self.kernels())

    @per_run
    def input_wait(self) -> pd.DataFrame:
        from diagnose.analysis.tables.device_idle import input_wait

        return input_wait(
            self.in_window(self.breakdown()), self.in_window(self.steps()), self.kernels(), self.device_data_wait()
        )
