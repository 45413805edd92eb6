#!/bin/bash
set -e
echo "Hello, world!" > /app/hello.txt
