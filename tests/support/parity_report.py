"""What the GPU parity scripts share (tests/capture/cuda_capture_parity.py,
tests/train/cuda_train_parity.py): the skip where no CUDA device is present,
and one result line per case, printed and appended to a JSON-lines file."""
import json

SKIPPED = 77  # the tests' SKIP_RETURN_CODE in CTest


def no_cuda(probe):
    """True, after saying so, when a kvscope run on cuda failed for want of a device."""
    if probe.returncode != 0 and "no CUDA device is available" in probe.stderr:
        print("SKIPPED: no CUDA device here (" + probe.stderr.strip().splitlines()[-1] + ")")
        return True
    return False


def report(record, jsonl=None):
    """Prints `record` (its "result" holds "passed") as an ok/FAIL line and appends it
    to `jsonl` when one is given. Returns whether the case passed."""
    line = json.dumps(record)
    passed = bool(record["result"].get("passed"))
    print(("ok   " if passed else "FAIL ") + line)
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(line + "\n")
    return passed
