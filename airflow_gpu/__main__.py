import sys

from airflow_gpu.cli import main

sys.exit(main())
