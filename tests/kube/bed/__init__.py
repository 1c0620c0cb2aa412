"""The Kubernetes test bed: control plane, Kueue, fake GPU nodes, the gpulab chart, z2jh's hub config."""
