"""Fedge's data: dataset loaders, the bundled demo subset, seeded partitioners and the client shard format.

    from fedge.fldata import load_dataset, partition, write_shard
    ds = load_dataset("fmnist-demo")
    shards = partition(ds, "dirichlet", 10, seed=0, alpha=0.3)
    write_shard("client-000.npz", shards[0])

numpy only (scipy for SVHN, imported when needed). This package must not import torch, zmq or any other
Fedge package; a test checks it. docs/data.md describes the datasets, the partitions and the file format.
"""

from fedge.fldata.dataset import DataError, Dataset, channel_stats, normalize
from fedge.fldata.loaders import DATASETS, USER_SHARDS, dataset_from_arrays, load_dataset
from fedge.fldata.partition import PARTITIONERS, partition
from fedge.fldata.shard import ClientShard, read_shard, summary, write_shard

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "ClientShard",
    "USER_SHARDS",
    "DataError",
    "Dataset",
    "channel_stats",
    "dataset_from_arrays",
    "load_dataset",
    "normalize",
    "partition",
    "read_shard",
    "summary",
    "write_shard",
]
