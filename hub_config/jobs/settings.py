"""Settings of gpulab's notebook jobs (``c.GPULabJobs.*``): where they run, where their
files live, their limits, and the Kubernetes details of the Job backend."""

from __future__ import annotations

import os
from pathlib import Path

from traitlets import Bool, Float, Int, List, TraitError, Type, Unicode, default, validate
from traitlets.config import Configurable

from spawner.core.labels import KUEUE_LOCAL_QUEUE_TEMPLATE


class GPULabJobs(Configurable):
    """Settings of gpulab's notebook jobs (``c.GPULabJobs.*``)."""

    backend_class = Type(
        default_value="hub_config.jobs.backends.local.LocalJobBackend",
        klass="hub_config.jobs.backends.base.JobBackend",
        config=True,
        help="""Where jobs run: a :class:`JobBackend` class or its import string.
        `hub_config.jobs.backends.local.LocalJobBackend` (the default): papermill
        processes on this server's GPUs, as their owners. On Kubernetes
        `hub_config.jobs.backends.kube.KubeJobBackend`: one batch/v1 Job per
        submission (the Helm overlay sets it).""",
    )
    home_dir_template = Unicode(
        "",
        config=True,
        help="""Where a user's home is, as the hub sees it; `{username}` is replaced.
        Notebook paths are relative to it. Default: the home of the user's system
        account when servers run as such accounts (`c.UserAccounts`), else the
        spawner's `c.SimpleLocalProcessSpawner.home_dir_template` when set, else
        the user's system home (`~username`).""",
    )
    max_output_bytes = Int(
        32 * 1024 * 1024,
        config=True,
        help="""Largest output notebook the hub serves (`GET /jobs/<id>/output`), in bytes. A larger
        one is refused with a 413 before any of it is read (its size is checked on the open file,
        so a sparse file of any apparent size costs nothing); it can still be opened from the
        user's own server.""",
    )
    max_notebook_bytes = Int(
        32 * 1024 * 1024,
        config=True,
        help="""Largest notebook a job may be submitted with, in bytes. Each job keeps its notebook as
        submitted beside its output (`runs/<name>-<stamp>.input.ipynb`, written as its owner), runs that
        copy, and Re-run runs it again; a larger notebook is refused with a 413 at submit.""",
    )
    max_parameters_bytes = Int(
        16 * 1024,
        config=True,
        help="Largest papermill parameters object accepted, in bytes of JSON.",
    )
    default_time_limit_seconds = Int(
        3600,
        config=True,
        help="Time limit of a job that names none, in seconds.",
    )
    max_time_limit_seconds = Int(
        7 * 24 * 3600,
        config=True,
        help="Longest time limit a job may ask for, in seconds.",
    )
    poll_interval = Float(
        2.0,
        config=True,
        help="Seconds between checks of running jobs (exits, time limits, queue, Kubernetes status).",
    )
    max_running_jobs_per_user = Int(
        4,
        config=True,
        help="""Most jobs one user runs at once on a single server, of every class (CPU-only
        included); more wait, queued, with the reason. A team's `limits.running_jobs` overrides
        it for its members' jobs in that team. 0: no cap.""",
    )
    stop_grace_seconds = Float(
        10.0,
        config=True,
        help="""The checkpoint grace: seconds a job has between SIGTERM and SIGKILL when it is
        cancelled, preempted or reaches its time limit, to save a checkpoint in
        `$GPULAB_CHECKPOINT_DIR` (docs/jobs.md). On one server the runner passes the SIGTERM to
        every process of the job and ends those still there when the grace is over (the hub
        sends SIGKILL a moment later, in case the runner could not); on Kubernetes it is the job
        pods' `terminationGracePeriodSeconds`.""",
    )
    max_nodes = Int(
        8,
        config=True,
        help="""Most nodes a training job may ask for (`nodes`): it then holds `nodes` × its
        profile's GPUs, admitted all at once or not at all. Only a script runs on several
        nodes, on whole GPUs; one server is one node.""",
    )
    torchrun_command = List(
        Unicode(),
        default_value=["torchrun"],
        config=True,
        help="""The launcher a single-server script job over N whole GPUs runs as
        `<launcher> --standalone --nnodes=1 --nproc_per_node=N script args...`. The default,
        `torchrun`, is PyTorch's beside the job's Python (the environment the user's lab runs
        in) when torch is installed there, else the first on the job's PATH. A script on one
        GPU, a fraction or no GPU runs as `python script args...`.""",
    )
    state_dir = Unicode(
        config=True,
        help="""Folder for the single-server runner's exit-status files when jobs run as the
        hub's own account (no user isolation). Jobs run as their owners' accounts keep theirs
        in the owner's home (`~/.gpulab/jobs/`), where no other user can list or read them.
        Default: `jobs/` in `$GPULAB_DATA_DIR`.""",
    )
    env_keep = List(
        Unicode(),
        default_value=[
            "PATH",
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "CONDA_PREFIX",
            "CONDA_DEFAULT_ENV",
            "LANG",
            "LC_ALL",
            "LD_LIBRARY_PATH",
            "TZ",
        ],
        config=True,
        help="""Variables a local job inherits from the hub's environment (everything else,
        such as CONFIGPROXY_AUTH_TOKEN, is not passed on).""",
    )
    kube_namespace = Unicode(
        config=True,
        help="Namespace of teams that name none (default: the hub's, from POD_NAMESPACE, else `default`).",
    )
    kube_image = Unicode(
        config=True,
        help="""Image a Kubernetes job runs in when its profile names none. Default: the
        spawner's `c.KubeSpawner.image`, so a job runs in the same image as the
        user's server. It must contain papermill.""",
    )
    kube_home_claim_template = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""PersistentVolumeClaim holding the user's home, mounted into the job's pod, in
        KubeSpawner's template syntax ({username} and {user_server} are KubeSpawner's safe
        slugs of the user name). Default: KubeSpawner's own `pvc_name_template`, so the job
        mounts the claim the user's server mounts. With a ReadWriteOnce claim, a job can
        only start on the node of the user's running server (see docs/kubernetes.md).
        Empty: no home volume.""",
    )
    kube_home_mount_path = Unicode(
        "/home/jovyan",
        config=True,
        help="Where the home volume is mounted in the job's pod.",
    )
    kube_home_sub_path = Unicode(
        "",
        config=True,
        help="subPath of the home volume ({username}: KubeSpawner's safe slug), if homes share a claim.",
    )
    kube_ttl_seconds_after_finished = Int(
        86400,
        config=True,
        help="`ttlSecondsAfterFinished` of the Jobs: finished Jobs are removed after this.",
    )
    kube_backoff_limit = Int(
        2,
        config=True,
        help="""`backoffLimit`: pod failures (an OOM kill, a node failure) before the Job fails.
        A notebook that raised fails the Job at once; preemptions do not count.""",
    )
    kube_service_account = Unicode(
        "", config=True, help="Service account of the job pods (empty: the namespace default)."
    )
    kube_scheduler_name = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""`schedulerName` of the job pods of whole-GPU, time-sliced and MIG profiles
        (HAMi and KAI profiles always go to their own scheduler). Default: the spawner's
        `c.KubeSpawner.scheduler_name` -- with Zero to JupyterHub, its user-scheduler --
        so one scheduler binds the notebooks and jobs of a GPU pool: two schedulers would
        both bind the last free GPU of a node and its kubelet would reject one of the pods.
        Empty: the cluster's default scheduler.""",
    )
    kueue_enabled = Bool(
        False,
        config=True,
        help="""Put jobs on Kueue: each Job carries `kueue.x-k8s.io/queue-name` and is created
        suspended; Kueue admits it against the team's ClusterQueue.""",
    )
    kueue_queue_template = Unicode(
        KUEUE_LOCAL_QUEUE_TEMPLATE,
        config=True,
        help="""The team's Kueue LocalQueue name; `{team}` is replaced. The default is the
        name the Helm chart gives the LocalQueue it creates in each team namespace.""",
    )

    kube_training_engine = Unicode(
        "trainer",
        config=True,
        help="""What runs a multi-node job (`nodes` > 1) on Kubernetes: `trainer`, a Kubeflow
        Trainer TrainJob on `kube_training_runtime`; `jobset`, a JobSet (where Trainer is not
        installed); empty: multi-node jobs are refused. Either is admitted by Kueue as one
        workload (all nodes or none) when `kueue_enabled`; the Helm chart's `training.enabled`
        grants the hub the rights.""",
    )
    kube_training_runtime = Unicode(
        "gpulab-torch-distributed",
        config=True,
        help="""The ClusterTrainingRuntime of gpulab's TrainJobs: the one the Helm chart ships
        (`training.runtime.name`), torch's with the failure policy gpulab's job states rely on.""",
    )

    @validate("kube_training_engine")
    def _valid_training_engine(self, proposal):
        if proposal["value"] not in ("trainer", "jobset", ""):
            raise TraitError(f"kube_training_engine is 'trainer', 'jobset' or '', not {proposal['value']!r}")
        return proposal["value"]

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return str(Path(os.environ.get("GPULAB_DATA_DIR", ".")).resolve() / "jobs")

    @default("kube_namespace")
    def _default_namespace(self) -> str:
        return os.environ.get("POD_NAMESPACE", "default")
