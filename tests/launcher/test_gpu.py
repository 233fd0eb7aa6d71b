"""The real thing on a GPU machine: two SGLang servers and the router (off by default).

Run by hand on a box with SGLang installed (pip install -e '.[sglang,test]'):

    DYNSPEC_TEST_MODEL=meta-llama/Llama-3.1-8B-Instruct \\
    DYNSPEC_TEST_DRAFT=lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B \\
    DYNSPEC_TEST_GPUS=0-1 pytest -m gpu tests/launcher/test_gpu.py
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import openai
import pytest
from launcher_run import launched

pytestmark = pytest.mark.gpu


async def test_real_servers_serve_both_pools_and_stop_clean(tmp_path: Path) -> None:
    model = os.environ.get("DYNSPEC_TEST_MODEL")
    draft = os.environ.get("DYNSPEC_TEST_DRAFT")
    if not model or not draft:
        pytest.fail("set DYNSPEC_TEST_MODEL and DYNSPEC_TEST_DRAFT to run the GPU test")
    gpus = os.environ.get("DYNSPEC_TEST_GPUS", "0-1")
    extra = ["--gpus", gpus, "--model-path", model, "--draft-model-path", draft]
    extra += ["--threshold", "4", "--hysteresis", "1", "--drain-timeout", "60"]
    with launched(tmp_path, *extra, fake=False) as (run, ports):
        run.wait_for(r"\[dynspec\] policy threshold", timeout=1800)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{ports['router']}/v1", api_key="unused", max_retries=0
        )
        name = model.rstrip("/").split("/")[-1]

        async def one() -> str:
            raw = await client.chat.completions.with_raw_response.create(
                model=name,
                messages=[{"role": "user", "content": "Count to fifty."}],
                max_tokens=256,
            )
            assert raw.parse().choices[0].message.content
            return raw.headers["x-dynspec-backend"]

        assert await one() == "eagle"
        pools = await asyncio.gather(*(one() for _ in range(12)))
        assert set(pools) == {"eagle", "baseline"}
        run.send(signal.SIGINT)
        assert await asyncio.to_thread(run.wait, 300) == 130
        assert run.leftovers() == []
        await client.close()
