"""The public API in ``__all__`` is honest, and vt_envs stays light."""

from __future__ import annotations

import subprocess
import sys

import vt_envs


def test_all_names_exist():
    missing = [name for name in vt_envs.__all__ if not hasattr(vt_envs, name)]
    assert missing == []


def test_vt_envs_imports_without_torch_vllm_deepspeed():
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'vllm', 'deepspeed', 'transformers'}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vt_envs, gymnasium as gym\n"
        "env = gym.make('VT-Lookup-v0'); env.reset(seed=0)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch','vllm','deepspeed'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_vt_search_without_the_search_extra_or_torch_falls_back_to_bm25():
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'transformers', 'sentence_transformers'}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vt_envs, gymnasium as gym\n"
        "env = gym.make('VT-Search-v0', split='test'); env.reset(seed=0)\n"
        "obs, *_ = env.step('<search>capital of France</search>')\n"
        "print(env.unwrapped.tools['search'].retriever.name, 'Doc 1 (Title: ' in obs['text'])\n"
    )
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "bm25 True"
    assert "pip install 'vt-envs[search]'" in out.stderr  # the one-time message names the extra


def test_vt_train_all_names_exist():
    import vt_train

    missing = [name for name in vt_train.__all__ if not hasattr(vt_train, name)]
    assert missing == []
