#!/bin/bash
set -e
printf '{"name": "benchwright", "retries": 3}\n' > /app/config.json
