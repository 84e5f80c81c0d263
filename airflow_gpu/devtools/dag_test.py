"""`dag.test()` of one DAG file in a fresh interpreter, for tests that need a real task runner and
metadata DB without the scheduler: run `DAG_TEST_SCRIPT` as `python -c SCRIPT <dags folder> <dag_id>`;
it prints one line `RESULT {"state", "tis": {task_id: {"state", "try_number", "xcom"}}}`."""

DAG_TEST_SCRIPT = r'''
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance as TI
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.get_dag(sys.argv[2])
dr = dag.test()
out = {"state": str(dr.state), "tis": {}}
with create_session() as session:
    for ti in session.query(TI).filter(TI.dag_id == dag.dag_id, TI.run_id == dr.run_id):
        out["tis"][ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number}
    for x in session.query(XComModel).filter(XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id,
                                             XComModel.key == "return_value"):
        out["tis"].setdefault(x.task_id, {})["xcom"] = x.value
print("RESULT " + json.dumps(out, default=str), flush=True)
'''
