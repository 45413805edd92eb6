#!/bin/bash
set -e
seq 1 100 | awk '{ s += $1 } END { print s }' > /app/sum.txt
