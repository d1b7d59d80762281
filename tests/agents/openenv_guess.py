"""A higher/lower game written as an OpenEnv environment (openenv-core's ``Environment``, pydantic action and
observation), as the echo template of ``openenv init`` writes one; the adapter tests import it by path. Importing
it needs openenv-core (tests/agents/_openenv.py puts it on ``sys.path`` first)."""

from __future__ import annotations

from pydantic import Field

from tests.agents._openenv import load_openenv

_OPENENV = load_openenv()


class GuessAction(_OPENENV.Action):
    """A guess, as text."""

    message: str = Field(..., description="the policy's turn")


class GuessObservation(_OPENENV.Observation):
    """The game's answer."""

    feedback: str = Field(default="", description="higher, lower, or the opening line")


class GuessEnvironment(_OPENENV.Environment):
    """The hidden number is ``reset``'s ``answer``; reward -0.1 per wrong guess, 1 when guessed (done)."""

    def __init__(self, opening: str = "guess") -> None:
        super().__init__()
        self.opening = opening
        self._state = _OPENENV.State(step_count=0)

    def reset(self, seed=None, episode_id=None, answer: str = "0", **kwargs) -> GuessObservation:
        self.secret = int(answer)
        self._state = _OPENENV.State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=self.opening, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        try:
            guess = int(action.message.strip())
        except ValueError:
            return GuessObservation(feedback="NaN", reward=-0.1)
        if guess == self.secret:
            return GuessObservation(done=True, reward=1.0)
        return GuessObservation(feedback="higher" if guess < self.secret else "lower", reward=-0.1)

    @property
    def state(self):
        return self._state


class GuessClient:
    """A client-shaped wrapper (``reset`` / ``step`` return ``StepResult``, as ``SyncEnvClient`` does), in process."""

    def __init__(self) -> None:
        self.env = GuessEnvironment()

    def reset(self, **kwargs):
        observation = self.env.reset(**kwargs)
        return _OPENENV.StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def step(self, action):
        observation = self.env.step(action)
        return _OPENENV.StepResult(observation=observation, reward=observation.reward, done=observation.done)
