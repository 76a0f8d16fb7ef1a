"""Config ``deadline_slack``: the deciders plan to a shortened deadline, misses count the real one."""

import pytest

from agents.governors import make_governor
from daemon.simrun import run_sim
from platforms.dag import DagBuilder
from platforms.sim.plant import SimJob


class Recording:
    """maxfreq that remembers the deadlines it was shown."""

    name = "recording"

    def __init__(self):
        self.inner = make_governor("maxfreq")
        self.period_s = self.inner.period_s
        self.seen: list[float] = []

    def reset(self, seed=None):
        self.inner.reset(seed)

    def decide(self, obs):
        self.seen += [j.deadline_s for j in obs.jobs if j.deadline_s is not None]
        return self.inner.decide(obs)


def job(deadline_s):
    b = DagBuilder("chain")
    prev = ()
    for _ in range(4):
        prev = (b.add(2e8, 0.0, prev),)
    return SimJob(dag=b.build(), name="chain", deadline_s=deadline_s, release_t=0.0)


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.5])
def test_deciders_see_the_deadline_less_the_margin(margin):
    pol = Recording()
    res = run_sim("tx2", pol, [(job(10.0), None)], deadline_margin=margin)
    assert pol.seen and pol.seen == pytest.approx([10.0 * (1 - margin)] * len(pol.seen))
    # the job (well under a second) meets its real 10 s deadline; the result keeps 10 s
    assert res.jobs[0].deadline_s == 10.0 and res.jobs[0].deadline_met


def test_margin_out_of_range_is_refused():
    with pytest.raises(ValueError, match="deadline_margin"):
        run_sim("tx2", Recording(), [(job(1.0), None)], deadline_margin=1.0)
