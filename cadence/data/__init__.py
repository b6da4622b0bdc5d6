"""Input: `DataIterator` (passes, batches and a resumable position), device copies that overlap
compute, sharding across processes (`InputContext`, `build_dataloader`), and `DataFlow`.

It builds on `cadence.core`; the public names are exported by `cadence`.
"""
