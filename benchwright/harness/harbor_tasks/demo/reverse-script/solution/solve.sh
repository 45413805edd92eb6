#!/bin/bash
set -e
printf '#!/bin/bash\necho "$1" | rev\n' > /app/rev.sh
chmod +x /app/rev.sh
