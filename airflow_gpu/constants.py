"""Every label, annotation, resource name and env var shared across layers, in one place.

One name for one thing: a "gang" is a PodGroup is a gang; a "tier" is a workload tier everywhere.
"""

DOMAIN = "airflow-gpu.io"

# --- labels -------------------------------------------------------------------------------
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "airflow-gpu"
LABEL_TEAM = f"{DOMAIN}/team"
LABEL_TIER = f"{DOMAIN}/tier"
LABEL_TIER_CLASS = f"{DOMAIN}/tier-class"  # guaranteed | preemptible (ResourceQuotas per tier class)
LABEL_GANG = f"{DOMAIN}/gang"  # name of the PodGroup a pod belongs to
LABEL_GANG_RANK = f"{DOMAIN}/rank"
LABEL_POD_SET = f"{DOMAIN}/pod-set"  # the pod set (launcher, worker...) a member belongs to
LABEL_DAG_ID = f"{DOMAIN}/dag-id"
LABEL_TASK_ID = f"{DOMAIN}/task-id"
LABEL_RUN_ID = f"{DOMAIN}/run-id"
LABEL_TRY_NUMBER = f"{DOMAIN}/try-number"
LABEL_MAP_INDEX = f"{DOMAIN}/map-index"
LABEL_ATTEMPT = f"{DOMAIN}/attempt"  # AIRFLOW_GPU_ATTEMPT of the pods (one gang object set per attempt)
# The task-instance labels above are label-safe forms (kube.names.label_value); the exact values are
# kept in this annotation as JSON {"dag_id", "task_id", "run_id", "map_index", "try_number"}.
ANNOTATION_TASK_INSTANCE = f"{DOMAIN}/task-instance"

# Upstream pod-group labels (../shared/crds/README.md)
LABEL_COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"
ANNOTATION_VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"
LABEL_KUEUE_POD_GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
LABEL_KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"

# --- gang objects per backend (group, version, plural, kind) --------------------------------
PODGROUP_GROUP = "scheduling.x-k8s.io"  # scheduler-plugins PodGroup: the airflow-gpu scheduler's and coscheduling's
PODGROUP_VERSION = "v1alpha1"
PODGROUP_PLURAL = "podgroups"
PODGROUP_KIND = "PodGroup"
VOLCANO_PODGROUP_GROUP = "scheduling.volcano.sh"
VOLCANO_PODGROUP_VERSION = "v1beta1"
VOLCANO_PODGROUP_PLURAL = "podgroups"
GANG_BACKEND_AIRFLOW_GPU = "airflow-gpu"
GANG_BACKEND_COSCHEDULING = "coscheduling"
GANG_BACKEND_VOLCANO = "volcano"
GANG_BACKEND_KUEUE = "kueue"
GANG_BACKENDS = (GANG_BACKEND_AIRFLOW_GPU, GANG_BACKEND_COSCHEDULING, GANG_BACKEND_VOLCANO, GANG_BACKEND_KUEUE)
COSCHEDULING_SCHEDULER_NAME = "scheduler-plugins-scheduler"  # scheduler-plugins' second-scheduler manifests
VOLCANO_SCHEDULER_NAME = "volcano"
KUBE_DEFAULT_SCHEDULER_NAME = "default-scheduler"  # Kueue admits; kube-scheduler places

# --- annotations ----------------------------------------------------------------------------
ANNOTATION_WAIT_REASON = f"{DOMAIN}/wait-reason"
ANNOTATION_CHECKPOINTABLE = f"{DOMAIN}/checkpointable"
ANNOTATION_LAST_CHECKPOINT_TIME = f"{DOMAIN}/last-checkpoint-time"
ANNOTATION_LAST_CHECKPOINT_STEP = f"{DOMAIN}/last-checkpoint-step"
ANNOTATION_INTERRUPTIONS = f"{DOMAIN}/interruptions"  # relaunches after a disruption in this try
ANNOTATION_PREEMPTIONS = f"{DOMAIN}/preemptions"  # relaunches after a preemption in this try
ANNOTATION_GPU_PRODUCTS = f"{DOMAIN}/gpu-products"  # accepted products, preference order
# "true": the gang's GPU pods may straddle products (Gang.products_mixed); rarely wanted: a
# data-parallel job runs at its slowest GPU's pace, across NVLink domains, on mixed memory sizes
ANNOTATION_GPU_PRODUCTS_MIXED = f"{DOMAIN}/gpu-products-mixed"
# written by the scheduler on a gang's group object when it binds it: the GPU product (the quota file's
# name) its GPU pods were bound on; the operator reports it (XCom gpu_product, chargeback) for a gang
# that accepted several
ANNOTATION_GPU_PRODUCT = f"{DOMAIN}/gpu-product"
ANNOTATION_SIM_DURATION = f"{DOMAIN}/sim-duration-seconds"  # local cluster: simulated container run time
ANNOTATION_SIM_EXIT_CODE = f"{DOMAIN}/sim-exit-code"  # local cluster: simulated container exit code
ANNOTATION_MANAGED_POOL = f"{DOMAIN}/managed"
# scheduler (issue 6): topology ask on a PodGroup/pod ("clique", "rack:hard"); a gang admitted on
# borrowed quota (shown to users; the scheduler reads it from its own plan record); members bound of
# minMember. ANNOTATION_PLACEMENT is what older versions wrote as their plan: never read now, since
# pod owners can write annotations (the plan lives in the scheduler's own namespace, below).
ANNOTATION_TOPOLOGY = f"{DOMAIN}/topology"
ANNOTATION_BORROWED = f"{DOMAIN}/borrowed"
ANNOTATION_PLACEMENT = f"{DOMAIN}/placement"
ANNOTATION_SCHEDULED = f"{DOMAIN}/scheduled"
# The scheduler's crash-recovery record of a gang (binding plan, preemption nomination, admission on
# borrowed quota): one ConfigMap per gang in the scheduler's own namespace, named by the owner's UID,
# labelled with the scheduler name. Only the scheduler's service account may write there (deploy/rbac.yaml).
LABEL_PLAN_OF = f"{DOMAIN}/plan-of"
PLAN_CONFIGMAP_PREFIX = "airflow-gpu-plan-"
PLAN_DATA_KEY = "plan.json"
# The scheduler's record of the pods it preempted (pod UID -> preemptor, time), in its own namespace:
# how the Airflow side tells a preemption from an interruption once the pods are gone. The Eviction
# API replaces the pod's DisruptionTarget reason (PreemptionByScheduler -> EvictionByEvictionAPI),
# on a real API server as on the local cluster, so the pod's condition alone cannot say it.
PREEMPTIONS_CONFIGMAP_PREFIX = "airflow-gpu-preemptions-"
DEFAULT_SCHEDULER_NAMESPACE = "airflow-gpu-system"  # deploy/base/namespace.yaml
# The scheduler's published queue (kube/queue_status.py): one ConfigMap per scheduler in its own
# namespace, written only by its service account, read by the UI plugin and `airflow-gpu queue`.
LABEL_QUEUE_OF = f"{DOMAIN}/queue-of"  # not LABEL_PLAN_OF: it is no plan record
QUEUE_CONFIGMAP_PREFIX = "airflow-gpu-queue-"
QUEUE_DATA_KEY = "queue.json.gz"
DEFAULT_PUBLISH_INTERVAL = 5.0  # seconds between two publications at most (and on a change of the waiting set)
# the scheduler process's interpreter switch interval (sys.setswitchinterval; Python's own is 0.005 s):
# its cycle is CPU work among dozens of threads waiting on the API (watches, Bindings, status writes),
# each of which took the interpreter from it every 5 ms (bench cluster_scale's steady phase, README)
DEFAULT_SWITCH_INTERVAL = 0.05
# live logs (triggers/gang.py): the timestamp of rank 0's last log line copied to the task log, on rank 0's
# pod, so a restarted triggerer resumes after it (sinceTime) without copying a line twice
ANNOTATION_LOGGED_UNTIL = f"{DOMAIN}/logged-until"
# on_finish_action keeps a failed gang's ended pods for debugging until this time (RFC 3339); any later
# run of a GpuTrainingOperator in the namespace deletes kept pods past it
ANNOTATION_KEEP_UNTIL = f"{DOMAIN}/keep-until"
ANNOTATION_EXPECTED_DURATION = f"{DOMAIN}/expected-duration-seconds"  # lets smaller gangs backfill safely
# the gang's restart cost (seconds each restart computes nothing: start, state loading, NCCL setup),
# over its tier's; and how long its SIGTERM checkpoint takes (lost when the grace period is shorter)
ANNOTATION_RESTART_OVERHEAD = f"{DOMAIN}/restart-overhead-seconds"
ANNOTATION_CHECKPOINT_SECONDS = f"{DOMAIN}/checkpoint-seconds"

# Marker in an Airflow pool description: only pools carrying it are changed or deleted. Capitalised
# on purpose: `airflow pools list` renders with rich, which swallows "[lowercase...]" as markup.
POOL_DESCRIPTION_MARKER = "[Managed by airflow-gpu]"

# --- node labels set by the NVIDIA GPU operator and cloud providers -------------------------
NODE_GPU_PRODUCT = "nvidia.com/gpu.product"
NODE_GPU_COUNT = "nvidia.com/gpu.count"
NODE_GPU_MEMORY = "nvidia.com/gpu.memory"
NODE_MIG_STRATEGY = "nvidia.com/mig.strategy"
NODE_GPU_CLIQUE = "nvidia.com/gpu.clique"
NODE_ZONE = "topology.kubernetes.io/zone"
NODE_RACK = f"{DOMAIN}/rack"
NODE_CAPACITY_TYPE_KARPENTER = "karpenter.sh/capacity-type"
NODE_CAPACITY_TYPE_EKS = "eks.amazonaws.com/capacityType"
NODE_GKE_SPOT = "cloud.google.com/gke-spot"
CAPACITY_SPOT = "spot"
CAPACITY_ON_DEMAND = "on-demand"
TAINT_SPOT = f"{DOMAIN}/spot"
TAINT_KARPENTER_DISRUPTED = "karpenter.sh/disrupted"
TAINT_GKE_SPOT = "cloud.google.com/gke-spot"  # GKE taints spot node pools with it when asked to
# Taints the node lifecycle controller would set; the scheduler adds them for a cordoned or not-ready
# node so that it is filtered by the same taint/toleration logic as every other taint.
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"

# --- upstream workload labels and annotations (apps/v1, batch/v1, kube-node-lease) ----------
LABEL_POD_TEMPLATE_HASH = "pod-template-hash"
ANNOTATION_DEPLOYMENT_REVISION = "deployment.kubernetes.io/revision"
ANNOTATION_DEPLOYMENT_DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
ANNOTATION_DEPLOYMENT_MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
ANNOTATION_RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
# the container `kubectl logs/exec` use on a pod with sidecars: the gang's training container
ANNOTATION_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LABEL_JOB_NAME_LEGACY = "job-name"
LABEL_JOB_CONTROLLER_UID_LEGACY = "controller-uid"
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # label and annotation
FINALIZER_JOB_TRACKING = "batch.kubernetes.io/job-tracking"
NODE_LEASE_NAMESPACE = "kube-node-lease"

# --- extended resources ---------------------------------------------------------------------
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"  # + profile, e.g. nvidia.com/mig-1g.10gb

# --- pod conditions -------------------------------------------------------------------------
CONDITION_DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
REASON_EVICTION_BY_EVICTION_API = "EvictionByEvictionAPI"
REASON_DELETION_BY_TAINT_MANAGER = "DeletionByTaintManager"
REASON_TERMINATION_BY_KUBELET = "TerminationByKubelet"
REASON_DELETION_BY_POD_GC = "DeletionByPodGC"
POD_REASON_NODE_LOST = "NodeLost"  # pod status.reason the node controller sets when its node is gone
PODGROUP_PHASE_TIMED_OUT = "TimedOut"  # our PodGroup phase past spec.scheduleTimeoutSeconds (pods stay pending)
REASON_SCHEDULE_TIMEOUT = "ScheduleTimeout"  # Event reason when a PodGroup times out

# --- scheduler ------------------------------------------------------------------------------
DEFAULT_SCHEDULER_NAME = "airflow-gpu"

# --- environment contract between operator and training code (see checkpoint/ENV.md) -------
ENV_CHECKPOINT_URI = "AIRFLOW_GPU_CHECKPOINT_URI"
ENV_RESUME_URI = "AIRFLOW_GPU_RESUME_URI"
ENV_ATTEMPT = "AIRFLOW_GPU_ATTEMPT"
ENV_INTERRUPTIONS = "AIRFLOW_GPU_INTERRUPTIONS"
ENV_DEADLINE = "AIRFLOW_GPU_DEADLINE"
ENV_RESULT_PATH = "AIRFLOW_GPU_RESULT_PATH"  # rank 0's return.json: its JSON becomes the XCom `result`
# KubernetesPodOperator's path; the container's terminationMessagePath, so the kubelet keeps the file in the
# pod's status (at most RESULT_MAX_BYTES, what a kubelet keeps of a termination message)
RESULT_PATH = "/airflow/xcom/return.json"
RESULT_MAX_BYTES = 4096
ENV_CHECKPOINT_KEEP_LAST = "AIRFLOW_GPU_CHECKPOINT_KEEP_LAST"
ENV_CHECKPOINT_KEEP_EVERY = "AIRFLOW_GPU_CHECKPOINT_KEEP_EVERY"
# the example training script (airflow_gpu.checkpoint.examples.train_numpy) reads these too
ENV_EXAMPLE_EPOCHS = "AIRFLOW_GPU_EXAMPLE_EPOCHS"
ENV_EXAMPLE_STEPS_PER_EPOCH = "AIRFLOW_GPU_EXAMPLE_STEPS_PER_EPOCH"
ENV_EXAMPLE_STEP_SECONDS = "AIRFLOW_GPU_EXAMPLE_STEP_SECONDS"
ENV_EXAMPLE_SEED = "AIRFLOW_GPU_EXAMPLE_SEED"
ENV_EXAMPLE_LEARNING_RATE = "AIRFLOW_GPU_EXAMPLE_LEARNING_RATE"
ENV_EXAMPLE_KEEP_LAST = "AIRFLOW_GPU_EXAMPLE_KEEP_LAST"  # the example trainer's retention (the soak keeps all)
# the example DAGs (dags/): checkpoint URI prefix and the Secret with the S3 credentials of the pods
ENV_EXAMPLE_CHECKPOINTS = "AIRFLOW_GPU_EXAMPLE_CHECKPOINTS"
ENV_EXAMPLE_S3_SECRET = "AIRFLOW_GPU_EXAMPLE_S3_SECRET"
# rank environment of a gang's pods (torchrun / torch.distributed env:// init; one pod = one node)
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
DEFAULT_MASTER_PORT = 29500
# a gang of pod sets (launcher + workers): each pod's set, and per set its pods' DNS names (the
# headless Service's records), comma-separated: AIRFLOW_GPU_HOSTS_WORKER for the set "worker"
ENV_POD_SET = "AIRFLOW_GPU_POD_SET"
ENV_HOSTS_PREFIX = "AIRFLOW_GPU_HOSTS_"
EXIT_CODE_STOPPED = 143  # training saved a checkpoint on SIGTERM and stopped: NOT a success
# the checkpoint store stayed unreachable past AIRFLOW_GPU_S3_OUTAGE_SECONDS (EX_TEMPFAIL): an
# infrastructure failure, relaunched as the next attempt of the same try (as a Job's podFailurePolicy
# ignores an exit code)
EXIT_CODE_STORE_UNAVAILABLE = 75
ENV_S3_OUTAGE_SECONDS = "AIRFLOW_GPU_S3_OUTAGE_SECONDS"
DEFAULT_S3_OUTAGE_SECONDS = 300.0

# --- tiers ----------------------------------------------------------------------------------
TIER_PRODUCTION_TRAINING = "production-training"
TIER_BEST_EFFORT_TRAINING = "best-effort-training"
TIER_INFERENCE = "inference"
TIER_INTERACTIVE = "interactive"
TIERS = (TIER_INTERACTIVE, TIER_PRODUCTION_TRAINING, TIER_INFERENCE, TIER_BEST_EFFORT_TRAINING)
# core.reservation.ReservationHold: seconds a head of line of unknown start holds its nodes in a row (the
# quota file's scheduling.reservation_hold_seconds; the scheduler and the replay both read it)
DEFAULT_RESERVATION_HOLD_SECONDS = 3600.0
# core.hold.PlacementHold (held placements, an experiment of the simulators, not run by the scheduler:
# pods on Kubernetes carry no GPU share to hold): `--placement-hold` (fraction of the GPU capacity held
# at once; 0 = off) and `--placement-hold-seconds` (the longest a pod stays held, then it is bound where
# it was reserved). 60 s: the coscheduling plugin's default Permit wait, 1/15 of kube-scheduler's cap
# on one (15 min), 11 % of openb's median run (540 s)
DEFAULT_PLACEMENT_HOLD_BUDGET = 0.0
DEFAULT_PLACEMENT_HOLD_SECONDS = 60.0
# Restart cost of a stopped gang (core.model.restart_lost_gpu_seconds; quota file
# scheduling.restart_overhead_seconds, per tier tiers[].restart_overhead_seconds). 120 s: a restarted
# fine-tune pays pod start with a cached image, loading model and optimizer state from object storage
# and NCCL setup; each is tens of seconds on a warm cluster (minutes with an image pull)
DEFAULT_RESTART_OVERHEAD_SECONDS = 120.0
# Seconds a SIGTERM checkpoint takes when the gang declares none (quota file scheduling.checkpoint_seconds):
# 20 s fits Kubernetes' default terminationGracePeriodSeconds (30 s); a gang whose checkpoint is longer
# than its grace period says so (ANNOTATION_CHECKPOINT_SECONDS) and is charged for it
DEFAULT_CHECKPOINT_SECONDS = 20.0
DEFAULT_GRACE_SECONDS = 30.0  # Kubernetes' terminationGracePeriodSeconds when a pod sets none

# --- local cluster (airflow_gpu/localcluster) ------------------------------------------------
ENV_CLUSTER_TOKEN = "AIRFLOW_GPU_CLUSTER_TOKEN"  # bearer token `cluster up` requires (implies TLS)
ENV_CLUSTER_GC_FREEZE = "AIRFLOW_GPU_CLUSTER_GC_FREEZE"  # "0" turns off GC freezing (benchmark comparison)
# "1": answer writes before they are in the store log, as before issue 10 (benchmark comparison only:
# a kill -9 then loses answered writes)
ENV_CLUSTER_UNSAFE_ACK = "AIRFLOW_GPU_CLUSTER_UNSAFE_ACK"

# --- pools sync against a remote Airflow (secrets from the environment or a file, never argv) ---
ENV_API_TOKEN = "AIRFLOW_GPU_API_TOKEN"
ENV_API_USERNAME = "AIRFLOW_GPU_API_USERNAME"
ENV_API_PASSWORD = "AIRFLOW_GPU_API_PASSWORD"
