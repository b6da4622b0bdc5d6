"""Input: `DataIterator` (passes, batches and a resumable position), nested datasets (a mapping
of datasets as a mapping of iterators), device copies that overlap compute, sharding across
processes (`InputContext`, `build_dataloader`), and `DataFlow`.

It builds on `cadence.core`; the public names are exported by `cadence`.
"""
