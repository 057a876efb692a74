"""The reader under a real `lightning.Trainer` (CPU): epochs, and checkpoint/resume through Lightning's
own fit-loop state.

Lightning takes exactly `len(loader)` batches per epoch and then asks for a new iterator; it never
exhausts the old one. ShardLoader once moved to the next epoch only when an iterator was exhausted,
so epochs 0, 1, 2 got 24, 0, 24 steps here. Lightning saves `loader.state_dict()` of every train
loader that has `state_dict`/`load_state_dict` in the checkpoint (`FitLoop.on_save_checkpoint`,
key "combined_loader") and loads it into the loader before the resumed fit creates its iterator.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from robowds.reader import ShardDataset

from exports import export_synthetic

BATCH = 8
EPOCHS = 3
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # val listed (the two episodes robowds drew from val: 0.34 before plan 2): the counts below are of 4 train episodes
    return export_synthetic(tmp_path_factory.mktemp("lightning"), 6, 2, "--stride", "2",
                            "--set", "shard.max_samples=40", "--set", "splits.val=[ep_0000, ep_0005]")


class KeyRecorder(L.LightningModule):
    """A one-parameter model that records the sample keys of every training step."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.steps: list[tuple[int, list[str]]] = []  # (epoch, keys of the batch) per step

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.steps.append((self.current_epoch, list(batch["__key__"])))
        return (self.w - batch["joints"].float().mean()) ** 2  # joints: float32 [B, T, N]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def readme_datamodule() -> type:
    """The `ShardData` class of docs/reader.md's "With Lightning" snippet, run as it stands there."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "reader.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M)
    (block,) = [b for b in blocks if "class ShardData(" in b]
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/reader.md", "exec"), namespace)
    return namespace["ShardData"]  # type: ignore[return-value]


ShardData = readme_datamodule()


def data(path: Path, workers: int) -> L.LightningDataModule:
    return ShardData(path, batch_size=BATCH, num_workers=workers, seed=7)


def trainer(**kwargs: object) -> L.Trainer:
    options = dict(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(**{**options, **kwargs})


def plan_keys(path: Path, epoch: int) -> list[str]:
    """Epoch `epoch` of a fresh dataset, sample by sample, in this process."""
    ds = ShardDataset(path, "train", seed=7)
    ds.set_epoch(epoch)
    return [s["__key__"] for s in ds]


def fit_keys(path: Path, workers: int) -> tuple[list[tuple[int, list[str]]], int]:
    module, datamodule = KeyRecorder(), data(path, workers)
    trainer().fit(module, datamodule=datamodule)
    return module.steps, len(datamodule.train_dataloader())


@pytest.mark.parametrize("workers", [0, 2])
def test_every_epoch_is_its_full_plan(dataset_dir: Path, workers: int) -> None:
    steps, batches = fit_keys(dataset_dir, workers)
    plans = [plan_keys(dataset_dir, e) for e in range(EPOCHS)]
    assert batches == -(-len(plans[0]) // BATCH) == 24
    for epoch in range(EPOCHS):
        mine = [keys for e, keys in steps if e == epoch]
        assert len(mine) == batches, f"epoch {epoch}: {len(mine)} steps, len(loader) = {batches}"
        assert [k for keys in mine for k in keys] == plans[epoch]
    assert plans[0] != plans[1] != plans[2] and sorted(plans[0]) == sorted(plans[1]) == sorted(plans[2])


@pytest.mark.parametrize("workers, cut", [(0, 5), (0, 24), (0, 27), (2, 24), (2, 29)])
def test_checkpoint_and_resume_through_lightning(dataset_dir: Path, tmp_path: Path, workers: int, cut: int) -> None:
    """Stop after `cut` steps (24 = exactly the end of epoch 0) with a checkpoint written by Lightning's
    ModelCheckpoint, resume with a new Trainer, model and loader from it: the steps of both runs are
    those of an uninterrupted run, neither replayed nor skipped."""
    plans = [plan_keys(dataset_dir, e) for e in range(EPOCHS)]
    reference = [(e, plan[i:i + BATCH]) for e, plan in enumerate(plans) for i in range(0, len(plan), BATCH)]
    first = KeyRecorder()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=cut, save_top_k=-1)
    trainer(max_steps=cut, enable_checkpointing=True, callbacks=[saver]).fit(first,
                                                                             datamodule=data(dataset_dir, workers))
    assert len(first.steps) == cut
    (checkpoint,) = tmp_path.glob("*.ckpt")
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    (cursor,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]  # the loader's state_dict()
    assert (cursor["epoch"], cursor["consumed"]) == (cut // 24, cut % 24 * BATCH)  # never (0, 187): empty
    second = KeyRecorder()
    saver = ModelCheckpoint(dirpath=tmp_path / "resumed", every_n_train_steps=cut, save_top_k=-1)
    trainer(enable_checkpointing=True, callbacks=[saver]).fit(second, datamodule=data(dataset_dir, workers),
                                                            ckpt_path=checkpoint)
    assert first.steps + second.steps == reference
