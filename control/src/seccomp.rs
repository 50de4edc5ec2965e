//! The seccomp filter of bubblewrap sandboxes, as data compiled by seccompiler: system calls a
//! coding agent never needs and that widen the kernel's attack surface or reach outside the
//! sandbox (new namespaces, mounts, kernel modules, keyrings, BPF, perf, userfaultfd, clock and
//! reboot) fail with EPERM. Everything else is allowed; capabilities are already all dropped.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The refused system calls, with why a sandbox has no use for them.
const REFUSED: &[(&str, i64)] = &[
    // New namespaces: the way to nested-privilege tricks (user namespaces) and to leaving ours.
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    // Mounts: the sandbox's filesystem view is set up once, from outside.
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    // The kernel itself.
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    // Large attack surfaces with no use in a build.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    // Time is the host's.
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
];

/// The filter compiled for this machine, as the bytes bubblewrap's `--seccomp FD` reads.
pub(crate) fn filter_bytes() -> Result<Vec<u8>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e:?}"))?;
    let rules = REFUSED.iter().map(|(_, nr)| (*nr, Vec::new())).collect::<BTreeMap<_, _>>();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)
        .map_err(|e| format!("seccomp: {e}"))?;
    let program: BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filter_compiles_to_whole_instructions() {
        let bytes = super::filter_bytes().unwrap();
        assert!(!bytes.is_empty() && bytes.len().is_multiple_of(8), "{} bytes", bytes.len());
    }
}
