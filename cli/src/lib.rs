//! What the `tessel` command works out before it starts anything, kept as
//! a library so that it is tested and fuzzed apart from flag parsing (as
//! etcd keeps `etcdmain` beside its server): [`identity`], who a process is
//! and who its peers are, from its flags or from Kubernetes' or Slurm's
//! environment.

pub mod identity;
