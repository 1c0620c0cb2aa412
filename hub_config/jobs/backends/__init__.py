"""Where notebook jobs run: :mod:`.local` (papermill processes on the single server's
GPUs) and :mod:`.kube` (one ``batch/v1`` Job per submission). ``c.GPULabJobs.backend_class``
chooses one; both implement :class:`.base.JobBackend`."""
