"""The nft command backend without an nft binary: a refusal the service retries, not a crash."""

from __future__ import annotations

import pytest
import trio

from flock.policy._backend import NftCommand, NftError


async def test_a_missing_nft_binary_is_an_nft_error(tmp_path) -> None:
    backend = NftCommand((str(tmp_path / "no-such-nft"),))
    with trio.fail_after(10), pytest.raises(NftError, match="cannot run"):
        await backend.run("list tables")
