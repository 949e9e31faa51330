"""A model that states its task: :class:`TaskModel`, and :func:`model_task` to read it.

Why a functional-model subclass and not the layer names or the card: the task is part of what the model *is* (the
exporters choose the served signatures by it), so it travels with the model's own config. ``model.to_json()``
(a preset's ``config.json``), ``model.save("x.keras")``, ``keras.models.model_from_json`` and
``keras.saving.load_model`` all keep it, with nothing but ``import ot_layers`` needed to read it back (the class is
registered as ``ot_layers>TaskModel``). The exporters then never guess the task from layer names, so a new head
needs no edit in ``export/``; a preset's card also names the task (``metadata.json``'s ``task``), and
``zoo.load`` checks the two agree.

A ``TaskModel`` is an ordinary Keras functional model (same layers, weights, ``fit``/``predict``/``save``); only
its config gains ``"task"``. A model that is not a ``TaskModel`` states no task (:func:`model_task` gives
``None``).

``keras.models.clone_model`` keeps the task too. Keras clones a functional subclass by calling its class with
``(inputs, outputs, name=...)`` only, so the task must be in the class: ``TaskModel(..., task=t)`` makes an instance
of a subclass per task (each still a ``TaskModel``, serialized under the same name, ``ot_layers>TaskModel``).
"""
import keras

TASKS = ("classification", "retrieval", "few_shot", "generic")


def check_task(task):
    """``task`` if it is one of :data:`TASKS`, else ``ValueError`` naming it."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {list(TASKS)}, got {task!r}.")
    return task


@keras.saving.register_keras_serializable(package="ot_layers")
class TaskModel(keras.Model):
    """``TaskModel(inputs, outputs, name=None, task=...)``: a functional model whose config carries its ``task``
    (one of :data:`TASKS`; see the module docstring for why)."""

    _class_task = "generic"

    def __new__(cls, *args, **kwargs):
        if cls is TaskModel:
            cls = _TASK_MODELS[check_task(kwargs.get("task", "generic"))]
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, inputs, outputs, name=None, **kwargs):
        # `task` is a keyword in **kwargs, not a named argument: Keras revives a functional subclass from its config
        # only when the constructor's named arguments are exactly Functional's (inputs, outputs, name).
        task = check_task(kwargs.pop("task", self._class_task))
        if type(self) in _TASK_MODELS.values() and task != self._class_task:
            raise ValueError(f"`task`: this TaskModel class states task {self._class_task!r}, not {task!r}; "
                             f"make the model with TaskModel(..., task={task!r}).")
        super().__init__(inputs, outputs, name=name, **kwargs)
        self.task = task

    def get_config(self):
        config = super().get_config()
        config["task"] = self.task
        return config


# One subclass per task, each named and registered as TaskModel; registering TaskModel itself again afterwards
# keeps `ot_layers>TaskModel` naming the base class when a config is read back (its "task" then picks the subclass).
# Each is also a module attribute under a qualified name of its own (_TaskModel_retrieval, ...), where pickle finds it.
_TASK_MODELS = {}
for _task in TASKS:
    _qualname = f"_TaskModel_{_task}"
    _TASK_MODELS[_task] = globals()[_qualname] = keras.saving.register_keras_serializable(
        package="ot_layers", name="TaskModel")(
        type("TaskModel", (TaskModel,), {"_class_task": _task, "__module__": __name__, "__qualname__": _qualname,
                                         "__doc__": f"A :class:`TaskModel` stating task {_task!r}."}))
keras.saving.register_keras_serializable(package="ot_layers")(TaskModel)


def model_task(model):
    """The task ``model`` states (a :class:`TaskModel`'s ``task``), or ``None``."""
    return model.task if isinstance(model, TaskModel) else None


def graph_problem(model):
    """Why ``model`` is not a model whose graph :func:`with_task` restates (what a preset holds), or ``None``: a
    functional model or a ``Sequential`` whose input is known; not another object, a ``Sequential`` without an
    ``Input`` that was never called, nor a subclassed model (whose ``call`` is Python code, not a config)."""
    if not isinstance(model, keras.Model):
        return f"must be a Keras model, got {type(model).__name__}"
    try:
        known = bool(model.inputs) and bool(model.outputs)
    except AttributeError:  # a Sequential never built, a subclassed model (neither has a graph of layers)
        known = False
    if known:
        return None
    if isinstance(model, keras.Sequential):
        return (f"is a Sequential model whose input is not known yet ({model.name!r}): give it a keras.Input first "
                "layer, or build it on data")
    return (f"must be a functional model (keras.Model(inputs, outputs)) or a Sequential, got the subclassed "
            f"{type(model).__name__}, whose call() no config describes")


def _structures(model):
    """``(inputs, outputs)`` of the functional or ``Sequential`` ``model`` as its graph was made: a dict of named
    outputs (or inputs) stays a dict; one tensor in a list is that tensor."""
    if isinstance(model, keras.Sequential):  # one input, one output
        return model.inputs[0], model.outputs[0]
    inputs, outputs = model.input, model.output  # a functional model: the structures it was made with

    def single(structure):
        return structure[0] if isinstance(structure, (list, tuple)) and len(structure) == 1 else structure

    return single(inputs), single(outputs)


def with_task(model, task):
    """``model`` as a :class:`TaskModel` stating ``task``: the model itself when it already states ``task``, else
    a ``TaskModel`` over the same graph (the same layers and weights, no copy; its inputs and outputs in the same
    structure, a dict of named outputs included). ``model``: a functional or ``Sequential`` model with a known input
    (:func:`graph_problem`; else ``ValueError`` naming ``model``)."""
    check_task(task)
    if model_task(model) == task:
        return model
    if model_task(model) is not None:
        raise ValueError(f"`task`: the model states task {model_task(model)!r}, not {task!r}.")
    problem = graph_problem(model)
    if problem:
        raise ValueError(f"`model` {problem}.")
    inputs, outputs = _structures(model)
    return TaskModel(inputs, outputs, name=model.name, task=task)
