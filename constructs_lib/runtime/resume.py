"""At boot, before the job starts: restore the newest complete checkpoint to local disk and
tell the job where it is (DL_RESUME_FROM in /etc/dl-launcher/resume.env, and a file)."""
from __future__ import annotations

import os
from typing import Optional

from .layout import resume_file as default_resume_file, write_atomic
from .store import CheckpointStore

ENV_FILE = "/etc/dl-launcher/resume.env"


def restore(store: CheckpointStore, local_dir: str, *, env_file: Optional[str] = None,
            resume_file: Optional[str] = None) -> Optional[tuple[int, str]]:
    env_file = env_file or os.environ.get("DL_RESUME_ENV", ENV_FILE)
    resume_file = resume_file or default_resume_file()
    got = store.pull(local_dir)
    write_atomic(env_file, f'DL_RESUME_FROM="{got[1]}"\nDL_RESUME_STEP="{got[0]}"\n' if got else "")
    write_atomic(resume_file, got[1] + "\n" if got else "")
    return got
