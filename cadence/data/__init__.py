"""Input: `DataIterator` (passes, batches and a resumable position), nested datasets (a mapping
of datasets as a mapping of iterators), device copies that overlap compute, sharding across
processes (`InputContext`, `build_dataloader`), and `DataFlow`; language-model data: token files
(`token_format`, `TokenShards`), `TokenLoader` (mixtures, exact at any number of data shards),
packing, `StreamLoader` (streamed datasets) and ``cadence prepare-data`` (`prepare`).

It builds on `cadence.core`; the public names are exported by `cadence`.
"""
