"""Run one of the collection's action plugins as the task executor would, with no connection to use."""
from typing import Any
from unittest import mock

from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task


def run_action(action_class: Any, args: dict[str, Any], check_mode: bool = False, diff: bool = False) -> dict[str, Any]:
    """The action's result for args; fails the test if the action used the connection (ran on a node)."""
    task = Task()
    task.args = args
    task.check_mode = check_mode
    task.diff = diff
    connection = mock.Mock(name="connection")
    templar = mock.Mock(name="templar")
    templar.template.side_effect = lambda value, *args, **kwargs: value   # values are given as the templar returns them
    action = action_class(task, connection, PlayContext(), loader=mock.Mock(), templar=templar,
                          shared_loader_obj=mock.Mock())
    result = action.run(task_vars={})
    connection.exec_command.assert_not_called()   # nothing runs on a node
    connection.put_file.assert_not_called()
    return result
