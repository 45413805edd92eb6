#!/bin/bash
# harbor verifier: reward 1 when the task is done, 0 otherwise.
mkdir -p /logs/verifier
if [ -x /app/rev.sh ] && [ "$(/app/rev.sh benchwright)" = "thgirwhcneb" ] && [ "$(/app/rev.sh ab)" = "ba" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
