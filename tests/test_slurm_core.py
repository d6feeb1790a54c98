"""Slurm's pure half (tui.core.slurm, the [slurm] table of tui.core.profile): the table's
checks, the job script, the commands, and the scheduler's answers read into records and words.

The scontrol, squeue and sbatch texts below were printed by the Slurm lane's real cluster
(Debian's slurm-wlm 22.05.8, tests/slurm/slurmlab.py)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from tui.cli.follow import OneHost
from tui.core.describe import death_lines, describe
from tui.core.errors import ProfileError
from tui.core.phases import Phase
from tui.core.profile import (
    HostConfig,
    Profile,
    load_profile,
    loads_profile,
    slurm_time_seconds,
)
from tui.core.protocol import ProcExit
from tui.core.slurm import (
    FirstDeath,
    JobClock,
    allocated_summary,
    allocation_end,
    end_verdict,
    expand_nodes,
    job_script,
    job_words,
    never_starts,
    no_accounting,
    node_host,
    parse_fields,
    parse_job,
    parse_job_id,
    parse_node_states,
    parse_queue,
    parse_sacct,
    parse_test_only,
    pending_words,
    preemption_seen,
    queue_detail,
    queued_summary,
    requeue_detail,
    sacct_argv,
    sbatch_options,
    scheduler_end,
    step_argv,
)
from tui.core.state import CauseUpdated, Died, LaunchMachine, PhaseChanged, State
from tui.core.status import status_line, timeline_rows, view_of
from tui.sim.demo import demo_profile
from tui.supervise.slurmjob import JobRun
from tui.supervise.supervisor import Supervisor

TIMEOUT_JOB = (
    "JobId=19 JobName=job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901741 "
    "Nice=0 Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:01:18 "
    "TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-12-07T16:26:01 "
    "EligibleTime=2026-12-07T16:26:01 AccrueTime=2026-12-07T16:26:01 "
    "StartTime=2026-12-07T16:26:02 EndTime=2026-12-07T16:27:20 Deadline=N/A "
    "PreemptEligibleTime=2026-12-07T16:26:02 PreemptTime=None SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-07T16:26:02 Scheduler=Main Partition=batch "
    "AllocNode:Sid=localhost:7350 ReqNodeList=(null) ExcNodeList=(null) NodeList=node-1 "
    "BatchHost=node-1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/tmp/runs/job-20261207-162601-91df93/job.sbatch WorkDir=/work/wt-slurm "
    "StdErr=/tmp/runs/job-20261207-162601-91df93/slurm-19.out StdIn=/dev/null "
    "StdOut=/tmp/runs/job-20261207-162601-91df93/slurm-19.out Power= \n")
PENDING_JOB = (
    "JobId=21 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901739 "
    "Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 "
    "TimeLimit=00:02:00 TimeMin=N/A SubmitTime=2026-12-07T16:27:33 "
    "EligibleTime=2026-12-07T16:27:33 AccrueTime=2026-12-07T16:27:33 StartTime=Unknown "
    "EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-07T16:27:34 Scheduler=Main Partition=batch "
    "AllocNode:Sid=localhost:8394 ReqNodeList=(null) ExcNodeList=(null) NodeList= "
    "NumNodes=1-1 NumCPUs=1 NumTasks=1 CPUs/Task=1 Command=(null) WorkDir=/work/main "
    "StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= \n")
BASE = '[host]\ntarget = "local"\n[server]\nengine = "vllm"\nmodel = "/models/m"\n'


def _profile(slurm: str) -> Profile:
    return loads_profile(BASE + "[slurm]\n" + slurm, "/profiles/serve.toml")


# --- the table ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("1:30", 90), ("4:00:00", 14400), ("1-12", 129600), ("1-12:30", 131400),
    ("1-0:0:5", 86405)])
def test_slurm_time_is_read_as_sbatch_reads_it(text: str, seconds: int) -> None:
    assert slurm_time_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0", "abc", "4h", "UNLIMITED", "1:2:3:4", ""])
def test_slurm_time_refuses_what_is_no_limit_or_not_slurms(text: str) -> None:
    with pytest.raises(ValueError):
        slurm_time_seconds(text)


def test_a_full_table_loads() -> None:
    profile = _profile('partition = "gpu"\naccount = "proj1"\nqos = "high"\ntime = "4:00:00"\n'
                       'gpus_per_node = 8\ncpus_per_task = 32\nmem = "256G"\n'
                       'constraint = "h100"\nsbatch_args = ["--exclusive", "--reservation=r1"]\n'
                       'job_name = "kimi"\nalert_before = "15m"\n')
    slurm = profile.slurm
    assert slurm is not None
    assert (slurm.partition, slurm.time_limit_s, slurm.gpus_per_node) == ("gpu", 14400, 8)
    assert (slurm.reach, slurm.alert_before, slurm.nodes) == ("step", 900.0, 1)
    assert slurm.sbatch_args == ("--exclusive", "--reservation=r1")


@pytest.mark.parametrize(("table", "line", "key", "words"), [
    ('partition = "gpu"\ntime = "4h"\n', 8, "slurm.time", "invalid Slurm time '4h'"),
    ('gres = "gpu:8"\ngpus_per_node = 8\n', 7, "slurm.gres", "not both"),
    ('sbatch_args = ["--output=x.out"]\n', 7, "slurm.sbatch_args",
     "--output is written by specconsole's job script"),
    ('sbatch_args = ["-Jname"]\n', 7, "slurm.sbatch_args", "[slurm].job_name"),
    ('sbatch_args = ["exclusive"]\n', 7, "slurm.sbatch_args", "expected an sbatch option"),
    ('partition = "gpu a100"\n', 7, "slurm.partition", "one word"),
    ('mem = "lots"\n', 7, "slurm.mem", "memory size"),
    ('nodes = 2\n', 7, "slurm.nodes", "2 nodes need a [cluster] table"),
    ('reach = "rsh"\n', 7, "slurm.reach", "expected one of: step, ssh"),
    ('parttion = "gpu"\n', 7, "slurm.parttion", "did you mean 'partition'?"),
    ('alert_before = "soon"\n', 7, "slurm.alert_before", "invalid duration"),
])
def test_a_bad_table_is_one_line_naming_file_line_and_key(table: str, line: int, key: str,
                                                          words: str) -> None:
    with pytest.raises(ProfileError) as refused:
        _profile(table)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"/profiles/serve.toml:{line}: {key}"), said
    assert words in said, said


def test_slurm_beside_a_container_is_refused_where_it_is_written() -> None:
    text = BASE + '[container]\nimage = "vllm/vllm-openai"\n[slurm]\npartition = "gpu"\n'
    with pytest.raises(ProfileError) as refused:
        loads_profile(text, "/p/serve.toml")
    assert str(refused.value).startswith("/p/serve.toml:8: slurm: [container] is not supported")


# --- the job script and the commands ----------------------------------------------------------

def test_the_job_script_has_the_tables_sbatch_lines_then_the_command(tmp_path: Path) -> None:
    path = tmp_path / "kimi.toml"
    path.write_text(BASE + '[slurm]\npartition = "gpu"\ntime = "4:00:00"\ngpus_per_node = 8\n'
                           'mem = "64G"\nsbatch_args = ["--exclusive"]\n')
    profile = load_profile(path)
    run_dir = "/home/u/runs/kimi-1"
    script = job_script(profile, "kimi-1", run_dir,
                        ["python3", "-c", "print('a b')", "$(touch /tmp/x)"],
                        stdin=f"{run_dir}/agent.stdin")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [ln.removeprefix("#SBATCH ") for ln in lines if ln.startswith("#SBATCH ")]
    assert directives == ["--job-name=kimi", f"--output={run_dir}/slurm-%j.out",
                          "--open-mode=append", "--nodes=1", "--ntasks-per-node=1",
                          "--partition=gpu", "--time=4:00:00", "--gpus-per-node=8",
                          "--mem=64G", "--exclusive"]
    assert directives == sbatch_options(profile, run_dir)
    # the command is quoted word by word: a profile value stays text
    assert shlex.split(lines[-1]) == ["python3", "-c", "print('a b')", "$(touch /tmp/x)", "<",
                                      f"{run_dir}/agent.stdin"]
    # the run id is the server's (the agent sets it), never the script's own environment
    assert not any(ln.startswith("export SPECCONSOLE_RUN_ID") for ln in lines)
    assert "SPECCONSOLE_RUN_ID=kimi-1" in script


def test_the_agent_reaches_the_node_as_an_overlapping_step() -> None:
    argv = step_argv("494583", "node-07", ["python3", "-u", "-c", "x", "watch"])
    assert argv[:2] == ["srun", "--jobid=494583"]
    assert {"--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node-07"} <= set(argv)
    assert argv[-5:] == ["python3", "-u", "-c", "x", "watch"]


# `sinfo --noheader --Node --nodes=node-2 --format=%N|%t|%o` on the lane's cluster (a node is
# listed once per partition)
NODE_2 = "node-2|idle|10.231.2.2\nnode-2|idle|10.231.2.2\n"


def test_over_ssh_the_node_is_reached_at_the_schedulers_address_through_the_login_node() -> None:
    assert [(n.name, n.address) for n in parse_node_states(NODE_2)] == [("node-2",
                                                                          "10.231.2.2")]
    assert parse_node_states("gpu7|idle|\n")[0].address == "gpu7"
    local = HostConfig("local", known_hosts="/k/known_hosts", python="/venv/bin/python",
                       runs_dir="/shared/runs", keepalive_interval=1.0)
    direct = node_host(local, "10.231.2.2")
    assert (direct.target, direct.jump) == ("10.231.2.2", None)
    assert (direct.known_hosts, direct.strict_host_keys, direct.python, direct.runs_dir,
            direct.keepalive_interval) == ("/k/known_hosts", True, "/venv/bin/python",
                                           "/shared/runs", 1.0)
    login = HostConfig("alice@login1:2222", jump="bastion", strict_host_keys=False)
    through = node_host(login, "node-07")
    assert (through.target, through.jump) == ("alice@node-07", "bastion,alice@login1:2222")
    assert through.strict_host_keys is False  # the profile's own choice, as for any hop
    assert node_host(HostConfig("login1"), "fd00::7").target == "[fd00::7]"
    assert node_host(HostConfig("login1"), "fd00::7").jump == "login1"


def test_sbatch_parsable_job_id() -> None:
    assert parse_job_id("494583\n") == "494583"
    assert parse_job_id("494583;cluster2\n") == "494583"
    with pytest.raises(ValueError):
        parse_job_id("sbatch: error: Batch job submission failed")


def test_test_only_answer_and_refusal() -> None:
    ok = parse_test_only(0, "sbatch: Job 2 to start at 2026-12-07T16:17:16 using 1 processors "
                            "on nodes node-1 in partition batch\n")
    assert ok.ok and (ok.start, ok.nodes, ok.partition) == ("2026-12-07T16:17:16", "node-1",
                                                            "batch")
    assert ok.summary() == ("the scheduler would start it at 2026-12-07T16:17:16 on node-1 in "
                            "partition batch")
    refused = parse_test_only(1, "allocation failure: Requested time limit is invalid (missing "
                                 "or exceeds some limit)\n")
    assert not refused.ok and "Requested time limit is invalid" in refused.summary()
    partition = parse_test_only(1, "sbatch: error: invalid partition specified: nope\n"
                                   "allocation failure: Invalid partition name specified\n")
    assert partition.error == "invalid partition specified: nope"


# --- the scheduler's answers --------------------------------------------------------------------

def test_fields_with_spaces_run_to_the_next_key() -> None:
    fields = parse_fields("JobId=7 Command=/opt/my jobs/run.sh --x WorkDir=/home/u Power= ")
    assert fields == {"JobId": "7", "Command": "/opt/my jobs/run.sh --x",
                      "WorkDir": "/home/u", "Power": ""}


def test_a_timed_out_job_read_from_scontrol() -> None:
    job = parse_job(TIMEOUT_JOB)
    assert (job.job_id, job.state, job.reason, job.nodes) == ("19", "TIMEOUT", "TimeLimit",
                                                              ("node-1",))
    assert (job.exit_code, job.exit_signal, job.time_limit_s, job.run_time_s) == (0, 15, 60, 78)
    assert job.ended and not job.pending
    assert job.end_time == datetime(2026, 12, 7, 16, 27, 20)
    end = scheduler_end(job)
    assert end is not None and end.schedulers_doing
    assert end.words(45) == "TIMEOUT: the job's 1 min time limit ended it, 45 s after READY"


def test_a_pending_job_and_its_queue_line() -> None:
    job = parse_job(PENDING_JOB)
    assert job.pending and not job.ended and job.nodes == () and job.start_time is None
    assert scheduler_end(job) is None
    assert job.time_left_s(datetime(2026, 12, 7, 16, 28)) is None
    line = parse_queue("21|PENDING|Resources|N/A|\n")
    assert line is not None and (line.reason, line.start) == ("Resources", None)
    assert queued_summary(line) == "queued (Resources: waiting for nodes to free up)"
    assert parse_queue("") is None
    later = parse_queue("22|PENDING|Priority|2026-12-07T18:00:00|\n")
    assert later is not None
    assert queued_summary(later) == ("queued (Priority: jobs of higher priority are ahead of "
                                     "it), expected start 2026-12-07T18:00:00")


def test_a_running_jobs_time_left() -> None:
    running = parse_job(PENDING_JOB.replace("JobState=PENDING", "JobState=RUNNING")
                        .replace("EndTime=Unknown", "EndTime=2026-12-07T16:29:33")
                        .replace("NodeList= ", "NodeList=node-[1-2] "))
    assert running.time_left_s(datetime(2026, 12, 7, 16, 28, 3)) == 90
    assert allocated_summary(running) == "allocated on node-1 (+1)"


def test_a_job_in_status_words() -> None:
    running = parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", "JobState=RUNNING")
                        .replace("TimeLimit=00:01:00", "TimeLimit=04:00:00"))
    assert job_words(running, datetime(2026, 12, 7, 16, 15, 20)) == (
        "job 19 RUNNING on node-1, 12 min of 4 h left")
    assert job_words(parse_job(TIMEOUT_JOB), datetime(2026, 12, 7, 16, 30)) == (
        "job 19 TIMEOUT on node-1")


def test_reasons_that_never_start_by_themselves() -> None:
    assert never_starts("JobHeldUser") and never_starts("DependencyNeverSatisfied")
    assert not never_starts("Resources") and not never_starts("Priority")
    held = parse_queue("9|PENDING|JobHeldAdmin|N/A|\n")
    assert held is not None and queued_summary(held).endswith("it cannot start until someone "
                                                              "acts")
    assert pending_words("QOSMaxWallDurationPerJobLimit").startswith(
        "QOSMaxWallDurationPerJobLimit: a limit of its QOS or account is reached")
    assert pending_words("SomethingNew") == "SomethingNew"


def test_host_lists_expand() -> None:
    assert expand_nodes("node-[1-3,7]") == ("node-1", "node-2", "node-3", "node-7")
    assert expand_nodes("gpu[07-09],login1") == ("gpu07", "gpu08", "gpu09", "login1")
    assert expand_nodes("node-1") == ("node-1",)


@pytest.mark.parametrize(("state", "exit_code", "words"), [
    ("CANCELLED", "0:15", "CANCELLED: job 19 was cancelled (scancel)"),
    ("NODE_FAIL", "0:0", "NODE_FAIL: the scheduler lost node node-1"),
    ("PREEMPTED", "0:15", "PREEMPTED: a job of a higher priority took its node on node-1"),
    ("OUT_OF_MEMORY", "0:125", "OUT_OF_MEMORY: the job's memory limit was reached on node-1: "
                               "the kernel's cgroup OOM killer ended its processes"),
    ("FAILED", "1:0", "FAILED: the job's script ended with exit code 1 on node-1"),
    ("COMPLETED", "0:0", "COMPLETED: the job's script ended with exit code 0"),
])
def test_each_end_in_words(state: str, exit_code: str, words: str) -> None:
    job = parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", f"JobState={state}")
                    .replace("ExitCode=0:15", f"ExitCode={exit_code}"))
    end = scheduler_end(job)
    assert end is not None and end.words() == words


# `scontrol show job -o` of a job over its --mem=100M (python3 -c 'b=bytearray(400<<20)'), in the
# Slurm lane (slurm-wlm 22.05.8, task/cgroup on cgroup v1, 2026-12-07); its output ends with
# `slurmstepd-node-1: error: Detected 1 oom-kill event(s) in StepId=200004.batch. ...`
OOM_JOB = (
    "JobId=200004 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A "
    "Priority=4294901756 Nice=0 Account=(null) QOS=(null) JobState=OUT_OF_MEMORY "
    "Reason=OutOfMemory Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:125 RunTime=00:00:00 TimeLimit=00:02:00 TimeMin=N/A "
    "SubmitTime=2026-12-07T19:26:38 EligibleTime=2026-12-07T19:26:38 "
    "AccrueTime=2026-12-07T19:26:38 StartTime=2026-12-07T19:26:39 "
    "EndTime=2026-12-07T19:26:39 Deadline=N/A PreemptEligibleTime=2026-12-07T19:26:39 "
    "PreemptTime=None SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-07T19:26:39 "
    "Scheduler=Main Partition=batch AllocNode:Sid=localhost:15245 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=node-1 BatchHost=node-1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/tmp/scf StdErr=/tmp/scf/oom-200004.out "
    "StdIn=/dev/null StdOut=/tmp/scf/oom-200004.out Power= \n")


def test_out_of_memory_names_the_jobs_memory_limit_and_what_it_killed() -> None:
    job = parse_job(OOM_JOB)
    assert (job.state, job.memory, job.reason) == ("OUT_OF_MEMORY", "100M", "OutOfMemory")
    end = scheduler_end(job)
    assert end is not None and end.memory == "100M"
    assert end.words(30) == ("OUT_OF_MEMORY: the job's memory limit (100M) was reached on "
                             "node-1: the kernel's cgroup OOM killer ended its processes, 30 s "
                             "after READY")
    # the kernel kills at the limit while the job runs: long before the job's end or not, the
    # process it killed is its victim, never a crash of its own
    assert end_verdict(end, FirstDeath("EngineCore_DP0", 900.0), 1000.0) == (
        f"{end.words()}; EngineCore_DP0 was killed by it")
    assert parse_job(TIMEOUT_JOB).memory is None  # TRES without mem=


def test_who_cancelled_a_job_comes_from_the_accounting_or_is_said_unknown() -> None:
    assert sacct_argv("494583") == ["sacct", "-X", "--noheader", "--parsable2",
                                    "--jobs=494583", "--format=JobID,State"]
    # `CANCELLED by %u`: how sacct prints a cancelled job's state with the requester's uid
    # (SchedMD/slurm src/sacct/print.c, PRINT_STATE); the job id and `|` as --parsable2 prints
    by = parse_sacct("494583|CANCELLED by 1234\n", "494583")
    assert by is not None and (by.state, by.by_uid) == ("CANCELLED", 1234)
    # the lane's own sacct -c (jobcomp/filetxt, slurm-wlm 22.05.8): a state, no requester
    plain = parse_sacct("200003|CANCELLED\n", "200003")
    assert plain is not None and (plain.state, plain.by_uid) == ("CANCELLED", None)
    assert parse_sacct("200003|CANCELLED\n", "9") is None
    assert parse_sacct("", "9") is None
    # the lane's sacct without accounting (AccountingStorageType=accounting_storage/none): exit 1
    assert no_accounting("Slurm accounting storage is disabled\n")
    assert not no_accounting("sacct: error: slurmdbd: Connection refused\n")
    cancelled = scheduler_end(parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT",
                                                            "JobState=CANCELLED")))
    assert cancelled is not None
    assert replace(cancelled, cancelled_by="user alice (uid 1234)").words(45) == (
        "CANCELLED: job 19 was cancelled by user alice (uid 1234) (scancel), 45 s after READY")
    assert replace(cancelled, accounting=False).words() == (
        "CANCELLED: job 19 was cancelled (scancel); this cluster keeps no accounting to say by "
        "whom")


def test_the_end_combined_with_the_first_death() -> None:
    timeout = scheduler_end(parse_job(TIMEOUT_JOB))
    failed = scheduler_end(parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", "JobState=FAILED")
                                     .replace("ExitCode=0:15", "ExitCode=1:0")))
    assert timeout is not None and failed is not None
    ended_at = 1000.0
    # a worker killed by the wall time: the scheduler's end, the worker its victim
    assert end_verdict(timeout, FirstDeath("Worker_TP3", 1000.5), ended_at) == (
        "TIMEOUT: the job's 1 min time limit ended it; Worker_TP3 was ended by it")
    # a worker that crashed long before the wall time stays the worker's
    assert end_verdict(timeout, FirstDeath("Worker_TP3", 900.0), ended_at).startswith(
        "Worker_TP3 died first; then TIMEOUT")
    # its own crash, the job failing after: the crash is the verdict, the job's end follows
    assert end_verdict(failed, FirstDeath("Worker_TP3", 990.0), ended_at) == (
        "Worker_TP3 died; the job then ended (FAILED: the job's script ended with exit code 1 "
        "on node-1)")
    assert end_verdict(timeout, None, ended_at).startswith("TIMEOUT")


# --- the scheduler's end in the launch machine ---------------------------------------------------

T0 = 1_000.0


def _started() -> LaunchMachine:
    machine = LaunchMachine()
    machine.started(100, T0, T0)
    return machine


def test_a_death_the_scheduler_caused_is_told_as_its_doing() -> None:
    machine = _started()
    died = machine.feed_exit(ProcExit(100, "APIServer", None, 15, T0 + 60, True), T0 + 60)
    assert any(isinstance(e, Died) for e in died)
    updated = machine.ended_by_scheduler("TIMEOUT: the job's 1 min time limit ended it", T0 + 61)
    assert [type(e) for e in updated] == [CauseUpdated]
    death = updated[0].death
    assert death.ended_by == "TIMEOUT: the job's 1 min time limit ended it"
    lines = death_lines(death)
    assert "was ended by the scheduler" in lines[0] and "signal 15" not in lines[0]
    assert lines[1] == ("root cause: TIMEOUT: the job's 1 min time limit ended it (the "
                        "scheduler's doing, not a crash)")
    assert machine.ended_by_scheduler(death.ended_by, T0 + 62) == []  # said once


def test_a_job_ended_before_the_agent_saw_a_death_is_still_a_death() -> None:
    machine = _started()
    events = machine.ended_by_scheduler("CANCELLED: job 7 was cancelled (scancel)", T0 + 5)
    died = [e for e in events if isinstance(e, Died)]
    assert len(died) == 1 and machine.state is State.DEAD
    assert died[0].death.ended_by == "CANCELLED: job 7 was cancelled (scancel)"


def test_our_own_kill_is_never_the_schedulers_end() -> None:
    machine = _started()
    machine.killing(T0 + 5)
    assert machine.ended_by_scheduler("CANCELLED: job 7 was cancelled (scancel)", T0 + 6) == []
    assert machine.death is None


def test_a_requeue_ends_the_runs_allocation() -> None:
    running = parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", "JobState=RUNNING"))
    assert allocation_end(running, 0, "node-1") is None
    requeued = parse_job(PENDING_JOB.replace("Restarts=0", "Restarts=1"))
    end = allocation_end(requeued, 0, "node-1")
    assert end is not None and end.schedulers_doing and end.requeued
    assert end.words() == ("REQUEUED: the scheduler took job 21 off node-1 and put it back in "
                           "the queue (a node's failure or a preemption)")
    assert allocation_end(requeued, 1, None) is not None  # pending again: not running yet
    running_again = parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", "JobState=RUNNING")
                              .replace("Restarts=0", "Restarts=1"))
    assert allocation_end(running_again, 1, "node-2") is None  # the allocation followed
    assert allocation_end(parse_job(TIMEOUT_JOB), 0, "node-1") == scheduler_end(
        parse_job(TIMEOUT_JOB))


# The output of a job preempted by a job of the higher-PriorityTier partition and requeued
# (PreemptMode=REQUEUE), in the Slurm lane (slurm-wlm 22.05.8, --open-mode=append): the first
# allocation's lines, slurmstepd's, then the second allocation's.
PREEMPTED_OUTPUT = (
    "start node-1 restart=none 19:16:58\n"
    "slurmstepd-node-1: error: *** JOB 3 ON node-1 CANCELLED AT 2026-12-07T19:17:01 DUE TO "
    "PREEMPTION ***\n"
    "got TERM 19:17:01\n"
    "start node-2 restart=1 19:17:25\n")


def test_a_requeue_witnessed_as_a_preemption_is_said_so_with_how_long_it_served() -> None:
    requeued = parse_job(PENDING_JOB.replace("JobId=21", "JobId=3")
                         .replace("Restarts=0", "Restarts=1").replace("Reason=Resources",
                                                                      "Reason=BeginTime"))
    end = allocation_end(requeued, 0, "node-1")
    assert end is not None
    preempted = preemption_seen(end, PREEMPTED_OUTPUT)
    assert (preempted.state, preempted.requeued, preempted.schedulers_doing) == (
        "PREEMPTED", True, True)
    assert preempted.words(130) == ("PREEMPTED: preempted by a higher-priority job on node-1 "
                                    "after 2 min 10 s of serving; requeued (job 3 back in the "
                                    "queue)")
    assert preempted.words() == ("PREEMPTED: preempted by a higher-priority job on node-1 "
                                 "before READY; requeued (job 3 back in the queue)")
    # no witness: a node's failure, or the line names another node or another end
    assert preemption_seen(end, "").state == "REQUEUED"
    assert preemption_seen(end, PREEMPTED_OUTPUT.replace("ON node-1", "ON node-3")
                           ).state == "REQUEUED"
    assert preemption_seen(end, PREEMPTED_OUTPUT.replace("PREEMPTION", "TIME LIMIT")
                           ).state == "REQUEUED"
    # a several-node job's line is its batch step's, on the first node: a member on another
    # node of the allocation reads it as its own job's preemption
    second = replace(end, node="node-2")
    assert preemption_seen(second, PREEMPTED_OUTPUT).state == "REQUEUED"
    assert preemption_seen(second, PREEMPTED_OUTPUT, ("node-1", "node-2")).state == "PREEMPTED"
    assert preemption_seen(end, PREEMPTED_OUTPUT.replace("JOB 3 ", "JOB 4 ")
                           ).state == "REQUEUED"
    line = parse_queue("3|PENDING|BeginTime|2026-12-07T19:17:12|\n")
    assert line is not None
    assert requeue_detail(preempted, line) == (
        "preempted (requeued): job 3 back in the queue (BeginTime: its begin time has not "
        "come) · expected start 2026-12-07T19:17:12")
    assert requeue_detail(end, line).startswith("requeued: job 3 back in the queue (")


def test_the_queue_is_the_timelines_first_phase_never_a_stall_nor_the_loads_time() -> None:
    """Queued with the scheduler's reason and expected start, a PhaseChanged each time what it
    says changes; nothing stalls or times out in the queue; the ETA and the load's time start
    at the allocation, and the queue stays on the timeline, before the launch."""
    machine = LaunchMachine(stall_timeout_s=5.0, expected_load_s=100.0)
    machine.preflight(T0)
    first = parse_queue("21|PENDING|Priority|N/A|\n")
    assert first is not None
    events = machine.queued(queue_detail(first), T0)
    assert [(e.phase, e.detail) for e in events if isinstance(e, PhaseChanged)] == [
        (Phase.QUEUED, "job 21 · Priority: jobs of higher priority are ahead of it")]
    assert describe(events[0]) == [
        "phase: queued (job 21 · Priority: jobs of higher priority are ahead of it)"]
    assert machine.queued(queue_detail(first), T0 + 1) == []  # said once
    later = parse_queue("21|PENDING|Resources|2026-12-07T18:00:00|\n")
    assert later is not None
    changed = machine.queued(queue_detail(later), T0 + 2)
    assert [e.detail for e in changed if isinstance(e, PhaseChanged)] == [
        "job 21 · Resources: waiting for nodes to free up · expected start 2026-12-07T18:00:00"]
    assert machine.tick(T0 + 600) == [] and machine.state is State.PREFLIGHT
    view = view_of(machine)
    assert view.eta(T0 + 30) is None
    assert status_line(view, T0 + 30) == (
        "job 21 · Resources: waiting for nodes to free up · expected start "
        "2026-12-07T18:00:00 · 30.0s")
    [row] = timeline_rows(view, T0 + 30)
    assert (row.mark, row.label, row.duration_s, row.current) == ("▶", "queued", 30.0, True)
    machine.allocated("job 21 allocated on node-7", T0 + 120)
    machine.started(300, T0 + 125, T0 + 125)
    assert machine.timeline is not None and machine.timeline.current is None
    view = view_of(machine)
    assert view.eta(T0 + 135) == 90.0, "the queue is not part of the load's expected time"
    assert view.elapsed(T0 + 135) == 10.0
    rows = timeline_rows(view, T0 + 135)
    assert [(r.mark, r.label, r.start_s, r.duration_s, r.detail) for r in rows] == [
        ("✓", "queued", -125.0, 120.0, "job 21 allocated on node-7"),
        ("▶", "starting Python", 0.0, 10.0, "")]
    died = machine.feed_exit(ProcExit(300, "APIServer", 1, None, T0 + 136, True), T0 + 136)
    death = next(e.death for e in died if isinstance(e, Died))
    assert death.phase is None and death.since_launch == 11.0, "never a death in the queue"


def test_a_running_jobs_time_is_in_the_header_and_moves_with_the_clock() -> None:
    running = parse_job(TIMEOUT_JOB.replace("JobState=TIMEOUT", "JobState=RUNNING")
                        .replace("TimeLimit=00:01:00", "TimeLimit=04:00:00"))
    clock = JobClock.of(running, T0, datetime(2026, 12, 7, 16, 15, 20))
    assert clock == JobClock("19", "node-1", 4 * 3600, T0 + 12 * 60)
    assert JobClock.of(parse_job(PENDING_JOB), T0, datetime(2026, 12, 7, 16, 15)) is None
    machine = _started()
    header = status_line(view_of(machine, job=clock), T0 + 60)
    assert header == "starting the server · 1m00s · job 19 on node-1 · 11 min of 4 h left"
    assert status_line(view_of(machine, job=clock), T0 + 11 * 60).endswith("1 min of 4 h left")
    machine.feed_exit(ProcExit(100, "APIServer", 1, None, T0 + 700, True), T0 + 700)
    assert "left" not in status_line(view_of(machine, job=clock), T0 + 700), "only while live"


async def test_wait_says_a_job_nearing_its_time_limit_in_a_line() -> None:
    """`wait` (past READY, or before it) prints the time-left alert as one line and goes on."""
    import asyncio

    from tui.cli.follow import OneHost, _follow
    from tui.supervise.events import Fatal, JobEnding
    from tui.supervise.supervisor import Supervisor

    said: list[str] = []
    events: asyncio.Queue[object] = asyncio.Queue()
    for event in (JobEnding("494583", 300.0), Fatal("the end of this test")):
        events.put_nowait(event)
    sup = Supervisor(load_profile(Path(__file__).parent.parent / "profiles" / "demo.toml"))
    code = await _follow(OneHost(sup), events, None, lambda text, **_: said.append(text), True)
    assert said[0] == "TIME LIMIT NEAR: job 494583 has 5 min left before its time limit ends it"
    assert code == 1 and said[1] == "ERROR: the end of this test"


def test_the_server_of_a_job_someone_submitted_is_its_scripts_top_process() -> None:
    """Of a job's processes on its node: the server, not the script's shell, srun, its engine
    core or its workers."""
    from tui.core.profile import AttachTarget
    from tui.core.slurm import JobProc, job_server, parse_job_procs

    procs = parse_job_procs(
        '[{"pid": 10, "ppid": 1, "start": 5, "comm": "bash", "cmd": "/bin/bash job.sbatch"},'
        ' {"pid": 11, "ppid": 10, "start": 6, "comm": "srun", "cmd": "srun vllm serve m"},'
        ' {"pid": 20, "ppid": 3, "start": 7, "comm": "vllm", "cmd": "vllm serve m"},'
        ' {"pid": 21, "ppid": 20, "start": 9, "comm": "VLLM::EngineCor", "cmd": "VLLM::Eng"},'
        ' {"pid": 22, "ppid": 21, "start": 9, "comm": "VLLM::Worker_TP", "cmd": "VLLM::W"}]')
    assert [p.pid for p in procs] == [10, 11, 20, 21, 22]
    assert job_server(procs) == JobProc(20, 3, 7, "vllm", "vllm serve m")
    assert job_server(procs[:2]) is None  # only the script's shell and srun: no server
    assert parse_job_procs("not json") == () and parse_job_procs('[{"pid": 1}]') == ()
    target = AttachTarget(slurm_job="494583")
    assert target.label == "attached-job494583"
    with pytest.raises(ValueError):
        AttachTarget(container="box", slurm_job="494583")


def test_wait_follows_a_requeued_allocations_death_and_stops_at_any_other() -> None:
    """`wait` (tui/cli/follow.py): a death its supervisor marked as a requeued allocation's is
    not the run's end (the run goes on to its next allocation); any other death is."""
    sup = Supervisor(demo_profile("ready", 1.0))
    machine = _started()
    died = [e for e in machine.ended_by_scheduler("PREEMPTED: ...; requeued", T0 + 5)
            if isinstance(e, Died)]
    target = OneHost(sup)
    assert target.is_death(died[0])  # not a job's run
    sup.job = JobRun("3", "/runs/r/job.sbatch")
    assert target.is_death(died[0])  # a job's, not requeued
    sup.job.requeued.append(died[0].death)
    assert not target.is_death(died[0])
    assert target.is_death(Died(replace(died[0].death, ended_by="PREEMPTED: ...; then job 3 "
                                                                "ended before it ran again")))
    assert sup.job.told("PREEMPTED: a") == "PREEMPTED: a"
    assert sup.job.told("TIMEOUT: b") == "PREEMPTED: a; then TIMEOUT: b"
    assert sup.job.output == "/runs/r/slurm-3.out"
