"""The token dataset of the Hugging Face keep tests: the same 256 sequences in the job under
torchrun (framework_keep_job.py) and in the one-process test (test_framework_keep.py)."""
import torch


class Pattern(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = torch.tensor([(i * 7 + k) % 50 for k in range(16)])
        return {"input_ids": ids, "labels": ids}
