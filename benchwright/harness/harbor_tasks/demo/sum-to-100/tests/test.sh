#!/bin/bash
# harbor verifier: reward 1 when the task is done, 0 otherwise.
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/sum.txt 2>/dev/null)" = "5050" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
