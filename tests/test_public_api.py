"""The public API in ``__all__`` is honest, and vt_envs stays light."""

from __future__ import annotations

import subprocess
import sys

import vt_envs


def test_all_names_exist():
    missing = [name for name in vt_envs.__all__ if not hasattr(vt_envs, name)]
    assert missing == []


def _run_with_imports_blocked(blocked: set[str], body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter where importing any of ``blocked`` fails."""
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {sorted(blocked)!r}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n" + body
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def test_vt_envs_imports_without_torch_vllm_deepspeed():
    out = _run_with_imports_blocked(
        {"torch", "vllm", "deepspeed", "transformers"},
        "import vt_envs, gymnasium as gym\n"
        "env = gym.make('VT-Lookup-v0'); env.reset(seed=0)\n"
        "heavy = {'torch', 'vllm', 'deepspeed'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n",
    )
    assert out.stdout.strip() == "[]"


def test_vt_search_without_the_search_extra_or_torch_falls_back_to_bm25():
    out = _run_with_imports_blocked(
        {"torch", "transformers", "sentence_transformers"},
        "import vt_envs, gymnasium as gym\n"
        "env = gym.make('VT-Search-v0', split='test'); env.reset(seed=0)\n"
        "obs, *_ = env.step('<search>capital of France</search>')\n"
        "print(env.unwrapped.tools['search'].retriever.name, 'Doc 1 (Title: ' in obs['text'])\n",
    )
    assert out.stdout.strip() == "bm25 True"
    assert "pip install 'vt-envs[search]'" in out.stderr  # the one-time message names the extra


def test_vt_train_all_names_exist():
    import vt_train

    missing = [name for name in vt_train.__all__ if not hasattr(vt_train, name)]
    assert missing == []
