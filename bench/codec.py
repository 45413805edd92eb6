"""What encryption costs: the Temporal payload codec (AES-256-GCM) per payload, encode and decode, at the sizes a
run's payloads have (a control call ~200 B, a launch body with its scorer ~8 KB, a phase result ~64 KB, the 2 MB
ceiling a payload may reach), against the pydantic converter alone; and a secret's encrypt/decrypt in the store.

    python bench/codec.py                  # 2,000 payloads per size, best of 5 rounds
    python bench/codec.py --n 500 --repeat 3

Prints per size: µs per payload for the codec's encode and decode, the converter's own to_payloads for the same
object, and the bytes the codec adds. CPU-bound, single thread; the machine's load shows in the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.contrib.pydantic import pydantic_data_converter

from benchwright.security.crypto import Keyring
from benchwright.security.payload_codec import EncryptionCodec

SIZES = {"control 200 B": 200, "launch 8 KB": 8 * 1024, "phase result 64 KB": 64 * 1024, "ceiling 2 MB": 2 << 20}


def _time(fn, n: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """µs per call: the best of ``repeat`` rounds of ``n`` calls (the least disturbed by other load)."""
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - start) / n * 1e6)
    return min(rounds)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    keyring = Keyring([os.urandom(32)], source="bench")
    codec = EncryptionCodec(keyring)
    converter = pydantic_data_converter.payload_converter
    print(f"{'payload':<20} {'to_payloads µs':>15} {'encode µs':>10} {'decode µs':>10} {'+bytes':>7}")
    for label, size in SIZES.items():
        value = {"task_impl": "x" * size}
        [payload] = converter.to_payloads([value])
        sealed = codec.encode_one(payload)
        n = max(20, args.n * 200 // max(size, 200)) if size > 64 * 1024 else args.n
        enc = _time(lambda p=payload: codec.encode_one(p), n, args.repeat)
        dec = _time(lambda s=sealed: codec.decode_one(s), n, args.repeat)
        convert = _time(lambda v=value: converter.to_payloads([v]), n, args.repeat)
        added = sealed.ByteSize() - payload.ByteSize()
        print(f"{label:<20} {convert:>15.1f} {enc:>10.1f} {dec:>10.1f} {added:>7}")
    kid, blob = keyring.encrypt(b"sk-" + b"k" * 48, aad=b"benchwright-secret:row")
    enc = _time(lambda: keyring.encrypt(b"sk-" + b"k" * 48, aad=b"benchwright-secret:row"), args.n, args.repeat)
    dec = _time(lambda: keyring.decrypt(kid, blob, aad=b"benchwright-secret:row"), args.n, args.repeat)
    print(f"secret (51 B): encrypt {enc:.1f} µs, decrypt {dec:.1f} µs")


if __name__ == "__main__":
    asyncio.run(main())
