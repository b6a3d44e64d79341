"""vllm-controlplane: the controller, its decision core and its command line."""
