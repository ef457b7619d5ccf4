"""The text the synthetic study (grail.tasks.slate.simulate) draws from: video titles and
channels per issue and slant (from 1.0, the pro side: gun rights, a $15 wage, to -1.0),
decorations appended to titles (odd characters and HTML entities included, as in real metadata),
and the survey's answer labels."""

TITLE_PARTS = {
    "gun_control": {
        1.0: (
            [
                "Why the Second Amendment Protects Us All",
                "Armed Citizens Stop Crime",
                "Gun Owners Push Back Against New Bans",
                "Concealed Carry Saves Lives",
                "The Truth About 'Assault Weapon' Bans",
                "Gun Rights Are Civil Rights",
            ],
            ["Liberty Arms Report", "Patriot Range TV", "Freedom Holster"],
        ),
        0.5: (
            [
                "Are New Gun Laws Going Too Far?",
                "A Hunter's View on Gun Regulation",
                "What Gun Owners Want You to Know",
                "Self-Defense & the Law",
            ],
            ["Frontier Talk", "Heartland Weekly"],
        ),
        0.0: (
            [
                "Gun Laws Explained: What the Data Says",
                "Debate: Should the US Ban Assault Rifles?",
                "How Background Checks Work",
                "Guns in America, by the Numbers",
            ],
            ["Civic Explainer", "Public Policy Lab"],
        ),
        -0.5: (
            [
                "Could Smarter Gun Laws Save Lives?",
                "A Gun Owner for Background Checks",
                "What Other Countries Did About Gun Deaths",
                "Red Flag Laws, Explained",
            ],
            ["Progressive Daily", "Open Square News"],
        ),
        -1.0: (
            [
                "Gun Violence Is a Public Health Crisis",
                "We Need Universal Background Checks Now",
                "Survivors Demand Common-Sense Gun Laws",
                "Ban Weapons of War From Our Streets",
                "How the Gun Lobby Blocks Reform",
                "Another Shooting, Another Excuse",
            ],
            ["Safer Streets Network", "End Gun Violence Media", "Moms for Safe Schools"],
        ),
    },
    "minimum_wage": {
        1.0: (
            [
                "Nobody Should Work Full Time and Live in Poverty",
                "Raise the Wage to $15 Now",
                "Fight for $15: Workers Speak",
                "Higher Wages Grow the Economy",
                "CEOs Got Raises, Workers Didn't",
                "A Living Wage Is a Human Right",
            ],
            ["Workers First TV", "Fight for Fifteen Network", "Living Wage Now"],
        ),
        0.5: (
            [
                "Should the Minimum Wage Keep Up With Inflation?",
                "A Small Raise, a Big Difference",
                "What Seattle Learned From a Higher Wage",
                "Wages Haven't Kept Up",
            ],
            ["Main Street Progress", "Open Square News"],
        ),
        0.0: (
            [
                "The Minimum Wage Debate, Explained",
                "What Economists Say About a $15 Wage",
                "Minimum Wage by the Numbers",
                "Pros and Cons of Raising the Wage",
            ],
            ["EconExplained", "Public Policy Lab"],
        ),
        -0.5: (
            [
                "Could a $15 Wage Cost Jobs?",
                "A Restaurant Owner on Rising Labor Costs",
                "Regional Wages Make More Sense",
                "The Hidden Cost of Wage Mandates",
            ],
            ["Small Business Voice", "Heartland Weekly"],
        ),
        -1.0: (
            [
                "The $15 Minimum Wage Will Kill Jobs",
                "Automation Is Coming for Wage Hikes",
                "Why Wage Mandates Hurt the Poor",
                "Let the Market Set Wages",
                "Small Businesses Can't Afford $15",
                "The Minimum Wage Myth",
            ],
            ["Free Market Minute", "Liberty Economics", "Job Creators Channel"],
        ),
    },
}
TITLE_DECOR = [
    "",
    "",
    "",
    " (Full Video)",
    " | Part 2",
    " — Explained",
    " #shorts",
    " 🔥",
    " [2019]",
    " &amp; What Comes Next",
    " “Must Watch”",
    "  ",
    " | Café Debate",
]

AGREE = ["Strongly oppose", "Somewhat oppose", "Neither", "Somewhat support", "Strongly support"]
IDEOLOGY = [
    "Very liberal",
    "Liberal",
    "Slightly liberal",
    "Moderate",
    "Slightly conservative",
    "Conservative",
    "Very conservative",
]
