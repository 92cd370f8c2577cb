"""Instructions for Meta-World's 50 tasks: four phrasings each, the last held out for evaluation.

Written from the task descriptions of the Meta-World paper (Yu et al. 2019, table of tasks), so
that a policy conditioned on language meets each task under more than one sentence: training
draws one of the first `TRAINING_PHRASINGS` per episode (from the reset's seed), and
`MetaWorldTasks(instructions="held_out")` says the last one, never seen in training, so that an
evaluation can ask whether the policy read the words or memorised the sentence.

The phrasings of all 50 tasks share one vocabulary (`all_sentences`): an env over any subset of
the tasks (MT10, ML10's test split) declares every sentence, so its observation space, and a
checkpoint's instruction embedding, are the same whatever tasks it was built with.
"""

from __future__ import annotations

TRAINING_PHRASINGS = 3  # the first three of each task's four; the fourth is held out

INSTRUCTIONS: dict[str, tuple[str, str, str, str]] = {
    "assembly-v3": (
        "pick up the nut and place it onto the peg",
        "put the ring on the peg",
        "assemble the nut onto the peg",
        "slide the nut down over the peg",
    ),
    "basketball-v3": (
        "dunk the ball into the basket",
        "put the ball in the hoop",
        "score a basket with the ball",
        "drop the ball through the hoop",
    ),
    "bin-picking-v3": (
        "move the puck from one bin to the other",
        "pick the puck out of the bin and place it in the other bin",
        "transfer the puck between the bins",
        "carry the puck over to the second bin",
    ),
    "box-close-v3": (
        "close the box with its lid",
        "put the lid on the box",
        "grasp the cover and close the box",
        "place the cover on top of the box",
    ),
    "button-press-topdown-v3": (
        "press the button from the top",
        "push the button down from above",
        "press down on the button",
        "hit the button from above",
    ),
    "button-press-topdown-wall-v3": (
        "reach past the wall and press the button from the top",
        "press the button down from above behind the wall",
        "go around the wall and push the button down",
        "avoid the wall and press down on the button",
    ),
    "button-press-v3": (
        "press the button",
        "push the button in",
        "press the button forward",
        "push the button with the gripper",
    ),
    "button-press-wall-v3": (
        "reach past the wall and press the button",
        "press the button behind the wall",
        "go around the wall and push the button in",
        "avoid the wall and push the button",
    ),
    "coffee-button-v3": (
        "press the button on the coffee machine",
        "push the coffee machine button",
        "start the coffee machine with its button",
        "hit the button of the coffee machine",
    ),
    "coffee-pull-v3": (
        "pull the mug from the coffee machine",
        "take the mug out from under the coffee machine",
        "drag the cup away from the coffee machine",
        "slide the mug back from the coffee machine",
    ),
    "coffee-push-v3": (
        "push the mug under the coffee machine",
        "slide the cup to the coffee machine",
        "move the mug beneath the coffee spout",
        "put the mug under the coffee machine",
    ),
    "dial-turn-v3": (
        "turn the dial",
        "rotate the dial half a turn",
        "spin the dial around",
        "twist the knob on the dial",
    ),
    "disassemble-v3": (
        "take the nut off the peg",
        "pull the ring up off the peg",
        "remove the nut from the peg",
        "lift the nut away from the peg",
    ),
    "door-close-v3": ("close the door", "swing the door shut", "push the door closed", "shut the door on its hinge"),
    "door-lock-v3": (
        "lock the door",
        "turn the lock of the door down",
        "rotate the door lock to locked",
        "set the lock on the door",
    ),
    "door-open-v3": ("open the door", "swing the door open", "pull the door open", "open the door on its hinge"),
    "door-unlock-v3": (
        "unlock the door",
        "turn the lock of the door up",
        "rotate the door lock to unlocked",
        "release the lock on the door",
    ),
    "drawer-close-v3": (
        "close the drawer",
        "push the drawer shut",
        "slide the drawer closed",
        "push the drawer back in",
    ),
    "drawer-open-v3": (
        "open the drawer",
        "pull the drawer out",
        "slide the drawer open",
        "pull the drawer open by its handle",
    ),
    "faucet-close-v3": (
        "turn the faucet off",
        "rotate the faucet handle closed",
        "close the tap",
        "twist the tap shut",
    ),
    "faucet-open-v3": ("turn the faucet on", "rotate the faucet handle open", "open the tap", "twist the tap open"),
    "hammer-v3": (
        "hammer the nail into the wall",
        "pick up the hammer and drive in the nail",
        "hit the nail with the hammer",
        "use the hammer to knock the nail in",
    ),
    "hand-insert-v3": (
        "put the gripper into the hole",
        "insert the hand into the hole",
        "lower the gripper into the hole in the table",
        "move the hand down into the hole",
    ),
    "handle-press-side-v3": (
        "press the handle down from the side",
        "push the side handle down",
        "push down on the handle from the side",
        "lower the handle from the side",
    ),
    "handle-press-v3": ("press the handle down", "push the handle down", "push down on the handle", "lower the handle"),
    "handle-pull-side-v3": (
        "pull the handle up from the side",
        "lift the side handle up",
        "pull up on the handle from the side",
        "raise the handle from the side",
    ),
    "handle-pull-v3": ("pull the handle up", "lift the handle up", "pull up on the handle", "raise the handle"),
    "lever-pull-v3": ("pull the lever up", "lift the lever", "rotate the lever upward", "raise the lever"),
    "peg-insert-side-v3": (
        "insert the peg into the hole from the side",
        "put the peg in the hole sideways",
        "push the peg sideways into the box",
        "slide the peg into the side hole",
    ),
    "peg-unplug-side-v3": (
        "unplug the peg from the side",
        "pull the peg out of the hole sideways",
        "remove the peg from the box sideways",
        "slide the peg out of the side hole",
    ),
    "pick-out-of-hole-v3": (
        "pick the puck up out of the hole",
        "lift the puck from the hole",
        "take the puck out of the hole",
        "grab the puck in the hole and raise it",
    ),
    "pick-place-v3": (
        "pick up the puck and place it at the goal",
        "put the puck at the target",
        "grasp the puck and move it to the goal",
        "carry the puck to the goal",
    ),
    "pick-place-wall-v3": (
        "pick up the puck and place it at the goal past the wall",
        "put the puck at the target behind the wall",
        "lift the puck over the wall to the goal",
        "carry the puck around the wall to the goal",
    ),
    "plate-slide-back-side-v3": (
        "slide the plate back out of the goal from the side",
        "pull the plate sideways out of the cabinet",
        "get the plate from the cabinet sideways",
        "draw the plate out sideways",
    ),
    "plate-slide-back-v3": (
        "slide the plate back out of the goal",
        "pull the plate out of the cabinet",
        "get the plate from the cabinet",
        "draw the plate back toward you",
    ),
    "plate-slide-side-v3": (
        "slide the plate into the goal from the side",
        "push the plate sideways into the cabinet",
        "slide the plate sideways into the cabinet",
        "move the plate sideways into the goal",
    ),
    "plate-slide-v3": (
        "slide the plate into the goal",
        "push the plate into the cabinet",
        "slide the plate forward into the cabinet",
        "move the plate into the goal",
    ),
    "push-back-v3": (
        "push the puck back to the goal",
        "pull the puck back to the target",
        "move the puck backward to the goal",
        "drag the puck back to the target",
    ),
    "push-v3": (
        "push the puck to the goal",
        "slide the puck to the target",
        "move the puck to the goal by pushing it",
        "shove the puck over to the target",
    ),
    "push-wall-v3": (
        "push the puck past the wall to the goal",
        "slide the puck around the wall to the target",
        "push the puck to the goal behind the wall",
        "shove the puck around the wall to the target",
    ),
    "reach-v3": (
        "reach the goal",
        "move the gripper to the target",
        "go to the goal position",
        "put the hand at the target",
    ),
    "reach-wall-v3": (
        "reach the goal past the wall",
        "move the gripper over the wall to the target",
        "go around the wall to the goal position",
        "put the hand at the target behind the wall",
    ),
    "shelf-place-v3": (
        "place the puck on the shelf",
        "put the puck onto the shelf",
        "pick up the puck and set it on the shelf",
        "lift the puck onto the shelf",
    ),
    "soccer-v3": (
        "kick the ball into the goal",
        "push the soccer ball into the net",
        "score a goal with the ball",
        "shoot the ball into the goal",
    ),
    "stick-pull-v3": (
        "pull the box with the stick",
        "grasp the stick and drag the box with it",
        "use the stick to pull the box",
        "hook the box with the stick and pull it",
    ),
    "stick-push-v3": (
        "push the box with the stick",
        "grasp the stick and push the box with it",
        "use the stick to push the box",
        "shove the box forward with the stick",
    ),
    "sweep-into-v3": (
        "sweep the puck into the hole",
        "push the puck into the hole",
        "slide the puck into the hole",
        "brush the puck into the hole",
    ),
    "sweep-v3": (
        "sweep the puck off the table",
        "push the puck off the edge of the table",
        "slide the puck off the table",
        "brush the puck off the table",
    ),
    "window-close-v3": (
        "close the window",
        "slide the window shut",
        "push the window closed",
        "slide the window pane closed",
    ),
    "window-open-v3": (
        "open the window",
        "slide the window open",
        "push the window open",
        "slide the window pane open",
    ),
}


def all_sentences() -> list[str]:
    """Every phrasing of every task, in a fixed order: what the instruction's vocabulary is made of."""
    return [sentence for name in sorted(INSTRUCTIONS) for sentence in INSTRUCTIONS[name]]
