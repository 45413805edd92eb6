#!/bin/bash
# harbor verifier: reward 1 when the task is done, 0 otherwise.
mkdir -p /logs/verifier
if python3 -c "import json,sys; d=json.load(open(\"/app/config.json\")); sys.exit(0 if d.get(\"name\")==\"benchwright\" and d.get(\"retries\")==3 else 1)"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
